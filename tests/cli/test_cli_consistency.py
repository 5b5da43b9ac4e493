"""What an operator's scripts rely on across commands: paths spelled
absolute in every message, one timestamp format, one set of JSON field
names (every field present, null where unknown), a PATH that cannot be
inspected listed with its error, --all meaning the same for shared and
exclusive holders, one wording for a missing directory, and usage errors
for --info a record cannot carry."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import mounts
from tests.support.cli import PYLOCK, Holder, cli, cli_env
from tests.support.kernel_locks import wait_blocked

STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
HOLDER_FIELDS = {
    "pid", "program", "argv", "hostname", "acquired_at", "held_for", "info", "verified",
    "shared", "start_time", "boot_id", "pidfs_ino", "record_private", "note",
}  # fmt: skip


def _stale(path: str) -> None:
    code = "import sys, pylock; pylock.Lock(sys.argv[1]).acquire()"
    subprocess.run([sys.executable, "-c", code, path], check=True, env=cli_env())


def test_json_fields_and_timestamps_are_the_same_in_who_and_list(
    tmp_path: Path, spawn_holder
) -> None:
    held, stale = str(tmp_path / "held.lock"), str(tmp_path / "stale.lock")
    holder = spawn_holder(held, info={"job": 1})
    _stale(stale)
    (who,) = json.loads(cli("who", "--json", held).stdout)
    assert set(who) == {"path", "held", "holders", "error"}
    entries = {
        Path(e["path"]).name: e for e in json.loads(cli("list", "--json", str(tmp_path)).stdout)
    }
    listed = entries["held.lock"]["holders"][0]
    for doc in (who["holders"][0], listed):
        assert set(doc) == HOLDER_FIELDS
        assert doc["pid"] == holder.pid
        assert doc["pidfs_ino"] is None or doc["pidfs_ino"] > 0
        assert STAMP.fullmatch(doc["acquired_at"]), doc["acquired_at"]
        assert doc["note"] is None and doc["record_private"] in (True, False)
    record = entries["stale.lock"]["record"]
    assert set(record) >= {"pid", "program", "hostname", "acquired_at", "alive"}
    assert "host" not in record and STAMP.fullmatch(record["acquired_at"])
    assert entries["stale.lock"]["error"] is None
    text = cli("who", held).stdout + cli("list", str(tmp_path)).stdout
    stamps = re.findall(r" since (\S+?)[,)\s]", text)
    assert len(stamps) == 3 and all(STAMP.fullmatch(s) for s in stamps), text


def test_a_path_that_cannot_be_inspected_is_in_the_json_with_its_error(tmp_path: Path) -> None:
    free = str(tmp_path / "free.lock")
    long = str(tmp_path / ("n" * 300))
    link = tmp_path / "link"
    link.symlink_to(free)
    out = cli("who", "--json", free, long, str(link))
    assert out.returncode == 66
    reports = json.loads(out.stdout)
    assert [r["path"] for r in reports] == [free, long, str(link)]
    assert reports[0]["held"] is False and reports[0]["error"] is None
    for report in reports[1:]:
        assert report["held"] is None and report["holders"] == []
        assert report["error"] and report["error"] in out.stderr
    assert "[Errno" not in out.stderr and "too long" in reports[1]["error"]


def test_messages_spell_paths_absolute(tmp_path: Path, spawn_holder) -> None:
    full = str(tmp_path / "job.lock")
    spawn_holder(full)
    env_cwd = {"cwd": str(tmp_path)}
    for args in (
        ["run", "-n", "job.lock", "true"],
        ["run", "-w", "0.01", "job.lock", "true"],
        ["wait", "-w", "0", "job.lock"],
        ["who", "job.lock"],
    ):
        out = cli(*args, **env_cwd)
        assert full in out.stdout + out.stderr, (args, out)
    for args in (["run", "no/x.lock", "true"], ["who", "no/x.lock"], ["wait", "no/x.lock"]):
        out = cli(*args, **env_cwd)
        assert f"{tmp_path}/no/x.lock" in out.stderr, (args, out.stderr)


def test_a_missing_directory_and_a_bad_name_are_said_in_one_wording(tmp_path: Path) -> None:
    missing = str(tmp_path / "no" / "x.lock")
    wording = f"the directory {tmp_path / 'no'} does not exist: create it first"
    messages = []
    for args in (["run", missing, "true"], ["who", missing], ["wait", missing]):
        out = cli(*args)
        assert out.returncode == 66, (args, out.stderr)
        messages.append(out.stderr)
    assert len(set(messages)) == 1 and wording in messages[0], messages
    long = str(tmp_path / ("n" * 300))
    for args in (["run", long, "true"], ["who", long], ["wait", long]):
        out = cli(*args)
        assert out.returncode == 66 and "[Errno" not in out.stderr, out.stderr
        assert "File name too long" in out.stderr


def test_all_means_the_same_for_shared_and_exclusive_holders(tmp_path: Path) -> None:
    """Each holder is a `pylock run` whose command inherits its descriptor:
    without --all one line per lock (the taker), with --all every process."""
    for mode in ([], ["-s"]):
        path = str(tmp_path / f"job{len(mode)}.lock")
        holders = [Holder([PYLOCK, "run", *mode], path) for _ in range(1 if not mode else 2)]
        try:
            plain = json.loads(cli("who", "--json", path).stdout)[0]["holders"]
            every = json.loads(cli("who", "--all", "--json", path).stdout)[0]["holders"]
            takers = sorted(h.proc.pid for h in holders)
            assert sorted(h["pid"] for h in plain) == takers, mode
            everyone = sorted([*takers, *(h.shell_pid for h in holders)])
            assert sorted(h["pid"] for h in every) == everyone, mode
        finally:
            for holder in holders:
                holder.release()


@pytest.mark.parametrize(
    "info", ['{"a": NaN}', '{"a": 1e999}', '{"a": -Infinity}', '{"a": "' + "x" * 17000 + '"}']
)
def test_info_a_record_cannot_carry_is_a_usage_error(lock_path: str, info: str) -> None:
    out = cli("run", "--info", info, lock_path, "true")
    assert out.returncode == 64, out.stderr
    (line,) = out.stderr.splitlines()
    assert line.startswith("pylock run: --info") and "unexpected" not in line
    assert not os.path.exists(lock_path)


@pytest.mark.root
def test_info_on_a_full_disk_is_said_on_stderr() -> None:
    with mounts.tmpfs(size="64k") as d:
        path = os.path.join(d, "full.lock")
        open(path, "wb").close()
        mounts.fill_space(d)
        out = cli("run", "--info", '{"job": 1}', path, "echo", "ran")
        assert (out.returncode, out.stdout) == (0, "ran\n")
        (line,) = out.stderr.splitlines()
        assert line.startswith(f"pylock: holding {path}, but its holder record") and (
            os.strerror(28) in line
        )


def test_wait_and_run_name_a_shared_holder_once_each(tmp_path: Path) -> None:
    """A blocked `pylock run` and a `pylock wait` are not holders: who lists
    only the two shared takers, with or without waiters queued behind them."""
    path = str(tmp_path / "job.lock")
    holders = [Holder([PYLOCK, "run", "-s"], path) for _ in range(2)]
    waiter = subprocess.Popen([PYLOCK, "run", path, "true"], env=cli_env())
    try:
        wait_blocked(path, waiter.pid)
        plain = json.loads(cli("who", "--json", path).stdout)[0]["holders"]
        assert sorted(h["pid"] for h in plain) == sorted(h.proc.pid for h in holders)
        assert all(h["shared"] for h in plain)
    finally:
        for holder in holders:
            holder.release()
        assert waiter.wait(timeout=30) == 0  # it got the lock once they let go
