"""Benchmark pylock against the locks people use today and against the floor.

    python bench/run.py            # full run, ~10 minutes on 2 cores
    python bench/run.py --quick    # smaller sizes, ~2 minutes

Installs the pinned ``bench`` dependency group of pyproject.toml into the
running interpreter, compiles bench/floor.c with the system cc, runs every
measurement side by side in this one run and writes bench/report.md and
bench/latency.png (and, for a full run into bench/, refreshes the figures
in bench/README.md).  Every table is printed as well.  See bench/README.md
for what each figure means.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _plot
import _readme
import _report
from _common import BENCH, FULL, QUICK, REPO, Context, Results, Row
from _measure_death import measure_death_many, measure_death_one
from _measure_lock import measure_contention, measure_front, measure_handoff, measure_uncontended
from _measure_waiters import measure_waiters
from _setup import (
    build_floor,
    describe_machine,
    ensure_pylock,
    install_group,
    pylock_record,
)
from _startup import measure_startup

SECTIONS = (
    "uncontended",
    "handoff",
    "takeover",
    "death",
    "contention",
    "startup",
    "front",
    "waiters",
)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (~2 minutes)")
    ap.add_argument("--no-install", action="store_true", help="do not pip install the bench group")
    ap.add_argument("--out", default=BENCH, help="where report.md and latency.png go (bench/)")
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections to run")
    ap.add_argument("--seed", type=int, default=None, help="seed for the randomised waits")
    ap.add_argument("--raw", default=None, help="also write every sample to this JSON file")
    args = ap.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(only) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    if sys.version_info < (3, 11) or not sys.platform.startswith("linux"):
        print(
            "bench/run.py needs Linux and Python 3.11+ (the pinned matplotlib and filelock"
            " need 3.11; pidfd and the seccomp fallback are Linux)",
            file=sys.stderr,
        )
        return 2
    if not args.no_install:
        install_group()

    sizes = QUICK if args.quick else FULL
    tmp = tempfile.mkdtemp(prefix="pylock-bench-")
    started = time.monotonic()
    try:
        floor, floor_linking = build_floor(tmp)
        pylock_error = ensure_pylock(tmp)
        if pylock_error:
            print(f"pylock is not usable, its rows will say so: {pylock_error}", file=sys.stderr)
        record = pylock_record(tmp, pylock_error is None)
        record_path = os.path.join(tmp, "record")
        with open(record_path, "wb") as f:
            f.write(record)
        ctx = Context(
            sizes=sizes,
            tmp=tmp,
            floor=floor,
            record_path=record_path,
            record_len=len(record),
            rng=random.Random(args.seed),
            pylock_error=pylock_error,
        )
        machine = describe_machine(tmp)
        machine["floor.c"] = f"{os.environ.get('CC', 'cc')} -O2, linked {floor_linking}"
        results: Results = {}
        measures: dict[str, Callable[[], dict[str, Row]]] = {
            "uncontended": lambda: measure_uncontended(ctx),
            "handoff": lambda: measure_handoff(ctx, kill=False),
            "takeover": lambda: measure_handoff(ctx, kill=True),
            "death": lambda: {
                **{f"one:{k}": r for k, r in measure_death_one(ctx).items()},
                **{f"many:{k}": r for k, r in measure_death_many(ctx).items()},
            },
            "contention": lambda: measure_contention(ctx),
            "startup": lambda: measure_startup(ctx),
            "front": lambda: measure_front(ctx),
            "waiters": lambda: measure_waiters(ctx),
        }
        for name in SECTIONS:
            if name in only:
                print(f"== {name}", file=sys.stderr, flush=True)
                t = time.monotonic()
                results[name] = measures[name]()
                print(f"   ({time.monotonic() - t:.0f} s)", file=sys.stderr, flush=True)
        machine["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
        machine["run time"] = f"{time.monotonic() - started:.0f} s"
        cmd = "python bench/run.py" + (" --quick" if args.quick else "")
        report = _report.render(results, machine, sizes, ctx.record_len, cmd)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "report.md"), "w") as f:
            f.write(report.markdown)
        _plot.plot(results, os.path.join(args.out, "latency.png"), cmd)
        if not args.quick and os.path.abspath(args.out) == BENCH and set(only) == set(SECTIONS):
            _readme.update_readme(os.path.join(BENCH, "README.md"), report.markdown)
            _readme.update_summary(os.path.join(REPO, "README.md"), report.summary)
        if args.raw:
            with open(args.raw, "w") as f:
                json.dump(
                    {
                        s: {
                            k: {"samples": r.samples, "error": r.error, **r.extra}
                            for k, r in rows.items()
                        }
                        for s, rows in results.items()
                    },
                    f,
                )
        print(report.markdown)
        print(f"wrote {os.path.join(args.out, 'report.md')} and latency.png", file=sys.stderr)
        return 1 if report.failed_rows else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
