"""The fallback's shared identity schedule (pylock/_exit/schedule.py, issue 14).

The schedule is driven by hand here (check_now, no thread, no sleeps): each
test sets up real processes, then asks for one round of checks and looks at
what it reported.  With EXACT_PER_TICK at 0 only the machine fingerprint
path can find an exit, which is what lets 10,000 watches cost nothing while
nothing changes; bench/exit_schedule.py measures that.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from pylock._core.process import identity_of
from pylock._exit import schedule as _exit_schedule
from pylock._exit.schedule import IdentitySchedule
from tests.support import env_with_repo, pidns
from tests.support.children import NonChild
from tests.support.procs import start_time

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")


@pytest.fixture
def target(non_child: type[NonChild]) -> NonChild:
    return non_child()


def _kill(target: NonChild) -> None:
    """Kill the target and return once it is a zombie its parent has not reaped."""
    target.kill()
    target.zombify()


@pytest.fixture
def only_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    """No exact checks in turn: only the fingerprint path can see an exit.
    No CPU budget either: check_now() runs back to back here."""
    monkeypatch.setattr(_exit_schedule, "EXACT_PER_TICK", 0)
    monkeypatch.setattr(_exit_schedule, "SWEEP_BUDGET", float("inf"))


def _fillers(schedule: IdentitySchedule, n: int, seen: list[str]) -> None:
    """n watches of a process that lives on (the test runner's parent)."""
    me = identity_of(os.getppid())
    assert me is not None
    for _ in range(n):
        schedule.add(me.pid, me.start_time, lambda: seen.append("filler"))


def test_a_reaped_process_is_seen_through_the_fingerprint(
    target: NonChild, only_fingerprint: None
) -> None:
    schedule = IdentitySchedule(threaded=False)
    seen: list[str] = []
    _fillers(schedule, 200, seen)
    schedule.add(target.pid, start_time(target.pid), lambda: seen.append("target"))
    assert schedule.check_now() == 0  # the first round checks everything exactly
    assert schedule.check_now() == 0
    _kill(target)
    target.reap()
    assert schedule.check_now() == 1
    assert seen == ["target"]
    assert len(schedule) == 200


def test_a_change_held_back_by_the_cpu_budget_is_not_lost(
    target: NonChild, only_fingerprint: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    schedule = IdentitySchedule(threaded=False)
    seen: list[str] = []
    _fillers(schedule, 100, seen)
    schedule.add(target.pid, start_time(target.pid), lambda: seen.append("target"))
    assert schedule.check_now() == 0
    monkeypatch.setattr(_exit_schedule, "SWEEP_BUDGET", 0.0)  # earns nothing...
    schedule._credit = -1.0  # ...and is spent
    _kill(target)
    target.reap()
    assert schedule.check_now() == 0  # held back...
    monkeypatch.setattr(_exit_schedule, "SWEEP_BUDGET", float("inf"))
    assert schedule.check_now() == 1  # ...and answered once the budget allows
    assert seen == ["target"]


def test_exits_in_a_burst_are_each_seen_at_the_next_round(
    non_child: type[NonChild], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the real budget and 10,000 watches (a sweep costs milliseconds):
    the second of two exits in a row is not held back by the first's sweep."""
    monkeypatch.setattr(_exit_schedule, "EXACT_PER_TICK", 0)  # only sweeps see exits
    schedule = IdentitySchedule(threaded=False)
    seen: list[str] = []
    _fillers(schedule, 10_000, seen)
    first, second = non_child(), non_child()
    for name, proc in (("first", first), ("second", second)):
        schedule.add(proc.pid, start_time(proc.pid), lambda n=name: seen.append(n))
    assert schedule.check_now() == 0  # the first round checks everything exactly
    for proc in (first, second):
        _kill(proc)
        proc.reap()
        assert schedule.check_now() == 1
    assert seen == ["first", "second"]
    assert schedule.stats["held"] == 0


def test_only_sweeps_that_find_no_watched_exit_spend_the_budget(
    non_child: type[NonChild], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The budget caps the sweeps the rest of the machine causes: watched
    processes that keep exiting are each seen at the next round, while a
    change that is not theirs spends the credit and the next one waits."""
    monkeypatch.setattr(_exit_schedule, "EXACT_PER_TICK", 0)  # only sweeps see exits
    schedule = IdentitySchedule(threaded=False)
    seen: list[str] = []
    _fillers(schedule, 1000, seen)
    procs = [non_child() for _ in range(3)]
    for i, proc in enumerate(procs):
        schedule.add(proc.pid, start_time(proc.pid), lambda i=i: seen.append(f"exit {i}"))
    assert schedule.check_now() == 0  # the first round checks everything exactly
    schedule._credit = 1e-9  # enough for one sweep, whatever it costs...
    schedule._credit_at = float("inf")  # ...and none is earned back
    for proc in procs:
        _kill(proc)
        proc.reap()
        assert schedule.check_now() == 1
    assert seen == ["exit 0", "exit 1", "exit 2"]
    assert schedule.stats["held"] == 0
    subprocess.run(["true"], check=True)  # a process of the machine's comes and goes
    assert schedule.check_now() == 0  # swept with the credit left...
    subprocess.run(["true"], check=True)
    assert schedule.check_now() == 0
    assert schedule.stats["held"] == 1  # ...which that sweep spent


def test_an_unreaped_zombie_is_seen_by_the_checks_in_turn(target: NonChild) -> None:
    schedule = IdentitySchedule(threaded=False)
    seen: list[str] = []
    schedule.add(target.pid, start_time(target.pid), lambda: seen.append("target"))
    assert schedule.check_now() == 0
    _kill(target)  # a zombie: exists for getpgid, leaves the fingerprint alone
    rounds = 0
    while not seen:
        rounds += 1
        schedule.check_now()
        assert rounds <= 1, "an unreaped zombie was missed"
    assert seen == ["target"]


def test_checks_in_turn_cover_every_watch(target: NonChild) -> None:
    schedule = IdentitySchedule(threaded=False)
    seen: list[str] = []
    n = 5 * _exit_schedule.EXACT_PER_TICK
    _fillers(schedule, n - 1, seen)
    schedule.add(target.pid, start_time(target.pid), lambda: seen.append("target"))
    schedule.check_now()
    _kill(target)  # an unreaped zombie: only the exact checks see it
    for _ in range(5):
        schedule.check_now()
    assert seen == ["target"]


def test_the_thread_runs_only_while_something_is_watched(target: NonChild) -> None:
    schedule = IdentitySchedule()
    gone = threading.Event()
    token = schedule.add(target.pid, start_time(target.pid), gone.set)
    thread = schedule._thread
    assert thread is not None and thread.is_alive()
    _kill(target)
    target.reap()
    assert gone.wait(30)
    schedule.remove(token)
    thread.join(10)
    assert not thread.is_alive()
    assert schedule._thread is None


# A pid recycled between two rounds: the victim is reaped and an impostor
# gets its pid (the task count is unchanged), so only the last-pid part of
# the fingerprint can show it.  Pids are handed out in turn, so reaching the
# victim's pid again means wrapping around past pid_max ("wrap": the last pid
# is then lower than before).  Root can also set the last pid back by hand
# (checkpoint/restore tools, this test's spawn_at) so that the fingerprint
# comes out identical ("set back"): only the checks in turn see that one.
RECYCLED = textwrap.dedent(
    """
    import json, os, sys, time
    from pylock._exit import schedule as _exit_schedule
    from pylock._exit.schedule import IdentitySchedule
    from tests.support.pidns import reap, spawn_at, start_time_of
    PID = 500
    sleeper = [sys.executable, "-c", "import signal; signal.pause()"]

    def past_start_tick(start):
        hz = os.sysconf("SC_CLK_TCK")
        while int(time.clock_gettime(time.CLOCK_BOOTTIME) * hz) <= start + 1:
            time.sleep(0.002)  # the impostor must start in another clock tick

    _exit_schedule.SWEEP_BUDGET = float("inf")  # check_now() runs back to back

    def recycle(case, exact_per_tick):
        _exit_schedule.EXACT_PER_TICK = exact_per_tick
        schedule = IdentitySchedule(threaded=False)
        seen = []
        me = start_time_of(os.getpid())
        for _ in range(100):
            schedule.add(os.getpid(), me, lambda: seen.append("filler"))
        victim = spawn_at(PID, sleeper)
        before = start_time_of(PID)
        later = spawn_at(PID + 100, sleeper) if case == "wrap" else None
        schedule.add(PID, before, lambda: seen.append("victim"))
        schedule.check_now()
        schedule.check_now()
        past_start_tick(before)
        victim.kill()
        victim.wait()
        impostor = spawn_at(PID, sleeper)
        rounds = 0
        while not seen and rounds < 10:
            rounds += 1
            schedule.check_now()
        out = {"differs": start_time_of(PID) != before, "rounds": rounds, "seen": seen}
        for p in (impostor, later):
            if p is not None:
                p.kill()
                p.wait()
        return out

    print(json.dumps({"wrap": recycle("wrap", 0), "set back": recycle("set back", 32)}))
    """
)


def test_a_recycled_pid_is_seen() -> None:
    reason = pidns.available()
    if reason is not None:
        pytest.skip(reason)
    proc = subprocess.run(
        pidns.pidns_command([sys.executable, "-c", RECYCLED]),
        capture_output=True,
        text=True,
        timeout=120,
        env=env_with_repo(),
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    # Wrapped: the very next round, through the fingerprint alone.
    assert out["wrap"] == {"differs": True, "rounds": 1, "seen": ["victim"]}
    # Set back: within ceil(101 / 32) = 4 rounds of checks in turn.
    assert out["set back"]["differs"] is True
    assert out["set back"]["seen"] == ["victim"]
    assert out["set back"]["rounds"] <= 4
