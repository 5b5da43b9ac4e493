"""Setting up a run: the peers, the C floor, pylock's C core, its record, the machine."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import zipfile

from _common import BENCH, REPO, WORKER, BenchError, worker_env


def bench_group() -> list[str]:
    import tomllib

    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        return list(tomllib.load(f)["dependency-groups"]["bench"])


def install_group() -> None:
    specs = bench_group()
    print(f"installing the bench group into {sys.executable}: {' '.join(specs)}", flush=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *specs],
        check=True,
    )


def build_floor(tmp: str) -> tuple[str, str]:
    """Compile floor.c; returns (executable, how it was linked).

    Static when the C library allows: the 10,000 sleepers then share only a
    few pages of floor's own text.  Dynamically linked, they share the pages
    of libc and ld.so 10,000 ways, and a memory monitor walking those pages'
    mappings (DAMON's pageout on this VM) holds up exits for milliseconds.
    """
    cc = os.environ.get("CC", "cc")
    exe = os.path.join(tmp, "floor")
    base = [cc, "-O2", "-std=c11", "-Wall", "-Wextra", "-o", exe, os.path.join(BENCH, "floor.c")]
    static = subprocess.run([*base, "-static"], capture_output=True, text=True)
    if static.returncode == 0:
        return exe, "static"
    try:
        subprocess.run(base, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BenchError(f"cannot compile bench/floor.c with {cc!r}: {exc}") from exc
    return exe, "dynamic (no static C library: the sleepers share libc's pages)"


def python_ok(code: str) -> str | None:
    """None when code runs in a worker's environment, else its error."""
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=worker_env(), capture_output=True, text=True
    )
    if res.returncode == 0:
        return None
    return (res.stderr.strip().splitlines() or [f"exit status {res.returncode}"])[-1]


def ensure_pylock(tmp: str) -> str | None:
    """Build pylock's C core in place when the checkout has none yet.

    First the quick way (csrc/_ffi_build.py with this interpreter's
    setuptools); when that setuptools is too old for pyproject.toml, a wheel
    built in pip's isolated build environment (the setuptools the project
    asks for), whose compiled core is copied into the checkout.  Nothing is
    installed into this interpreter either way.
    """
    if python_ok("import pylock._native") is None:
        return python_ok("import pylock; pylock.Lock")
    print("building pylock's C core in place (csrc/_ffi_build.py)", flush=True)
    res = subprocess.run(
        [sys.executable, os.path.join("csrc", "_ffi_build.py")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        print("  that failed; building a wheel in pip's isolated environment", flush=True)
        error = _core_from_wheel(tmp)
        if error:
            return f"building the C core failed: {res.stderr.strip()[-300:]}; then {error}"
    return python_ok("import pylock; pylock.Lock")


def _core_from_wheel(tmp: str) -> str | None:
    out = os.path.join(tmp, "wheel")
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", out, REPO],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        return f"pip wheel failed: {res.stderr.strip()[-300:]}"
    wheels = [w for w in os.listdir(out) if w.endswith(".whl")]
    if not wheels:
        return "pip wheel made no wheel"
    with zipfile.ZipFile(os.path.join(out, wheels[0])) as whl:
        cores = [
            n
            for n in whl.namelist()
            if n.startswith("pylock/_native") and n.endswith((".so", ".pyd"))
        ]
        if not cores:
            return f"{wheels[0]} holds no pylock/_native extension"
        for name in cores:
            with whl.open(name) as src, open(os.path.join(REPO, name), "wb") as dst:
                shutil.copyfileobj(src, dst)
    return None


def pylock_record(tmp: str, usable: bool) -> bytes:
    """The bytes pylock writes as its holder record, for the floors to write."""
    if usable:
        path = os.path.join(tmp, "record-probe.lock")
        code = (
            "import sys, pylock\n"
            f"lock = pylock.Lock({path!r})\n"
            "lock.acquire()\n"
            f"sys.stdout.buffer.write(open({path!r}, 'rb').read())\n"
            "lock.release()\n"
        )
        res = subprocess.run(
            [sys.executable, "-c", code, "worker", "holder", "pylock"],
            cwd=REPO,
            env=worker_env(),
            capture_output=True,
        )
        if res.returncode == 0 and res.stdout:
            return res.stdout
    # Same shape and about the same size as pylock's record.
    body = json.dumps(
        {
            "pid": 4242,
            "start_time": 123456,
            "boot_id": "0" * 36,
            "pidfs_ino": 0,
            "hostname": platform.node(),
            "program": sys.executable,
            "argv": [sys.executable, WORKER, "holder", "pylock"],
            "acquired_at": "2026-11-29T17:02:11.123456Z",
            "info": None,
        }
    ).encode()
    return b"pylock-record v1 %d %08x\n" % (len(body), 0) + body


def filesystem_of(path: str) -> str:
    """The type of the mount holding path, from /proc/self/mounts."""
    best, kind = "", "unknown"
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                mount = fields[1].replace("\\040", " ")
                inside = path == mount or path.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, kind = mount, fields[2]
    except OSError:
        pass
    return kind


def describe_machine(tmp: str) -> dict[str, str]:
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            mem = f"{int(f.readline().split()[1]) / 1048576:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    fs = filesystem_of(tmp)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    # Only changes to what is measured matter (the report itself is in bench/).
    changed = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "--", "pylock", "csrc"],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if commit and changed:
        commit += " with uncommitted changes to pylock/ or csrc/"
    versions = {}
    for name in ("filelock", "fasteners", "portalocker", "psutil", "matplotlib"):
        try:
            from importlib.metadata import version

            versions[name] = version(name)
        except Exception:
            versions[name] = "missing"
    return {
        "CPU": model,
        "cores": f"{os.cpu_count()} online, {len(os.sched_getaffinity(0))} usable by this run",
        "memory": mem,
        "kernel": f"{platform.system()} {platform.release()} ({platform.machine()})",
        "libc": " ".join(platform.libc_ver()),
        "Python": (
            f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})"
        ),
        "lock files on": f"{tmp} ({fs})",
        "pylock": f"checkout {commit or 'unknown'}",
        "peers": ", ".join(f"{k} {v}" for k, v in versions.items()),
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
