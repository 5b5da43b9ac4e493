"""The latency plot: every latency distribution of one run, log scale."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from _report import DEATH_LABELS, DEATH_MANY_LABELS, LABELS

if TYPE_CHECKING:
    from _common import Results, Row


def plot(results: Results, path: str, cmd: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: list[tuple[str, list[tuple[str, list[float]]]]] = []

    def collect(title: str, rows: dict[str, Row] | None, keys: list[tuple[str, str]]) -> None:
        if not rows:
            return
        series = [
            (label, [x / 1e3 for x in rows[k].samples])
            for k, label in keys
            if k in rows and rows[k].ok
        ]
        if series:
            panels.append((title, series))

    plain = {k: v.replace("`", "") for k, v in LABELS.items()}
    hk = [
        (k, plain[k])
        for k in (
            "pylock",
            "floor",
            "pylock-async",
            "floor-async",
            "filelock",
            "filelock-async",
            "fasteners",
            "portalocker",
        )
    ]
    collect("Handoff: release -> blocked waiter returns", results.get("handoff"), hk)
    collect("Takeover: SIGKILL of holder -> waiter returns", results.get("takeover"), hk)
    death = results.get("death") or {}
    one = {k[4:]: r for k, r in death.items() if k.startswith("one:")}
    many = {k[5:]: r for k, r in death.items() if k.startswith("many:")}
    dl = {k: v.replace("`", "") for k, v in DEATH_LABELS.items()}
    dl["pidfd-await"] = "bare: await add_reader(pidfd_open(pid))"
    collect(
        "Death notification: SIGKILL -> watcher returns (1 watched)",
        one,
        [
            (k, dl[k])
            for k in ("pylock", "pidfd-await", "psutil", "pylock-lock", "fallback", "fallback-lock")
        ],
    )
    n_many = next((r.extra.get("n") for r in many.values() if r.extra.get("n")), None)
    dml = {k: v.replace("`", "") for k, v in DEATH_MANY_LABELS.items()}
    collect(
        f"Death notification with {n_many:,} watched" if n_many else "Death notification, many",
        many,
        [
            (k, dml[k])
            for k in ("pylock-many", "pylock", "pidfd", "psutil", "fallback-many", "fallback")
        ],
    )
    if not panels:
        return
    height = sum(1.2 + 0.45 * len(s) for _, s in panels)
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(10, height), squeeze=False, layout="constrained"
    )
    rng = random.Random(0)
    for ax, (title, series) in zip(axes[:, 0], panels):
        labels = [s[0] for s in series][::-1]
        data = [s[1] for s in series][::-1]
        ax.boxplot(
            data,
            orientation="horizontal",
            whis=(1, 99),
            showfliers=False,
            widths=0.6,
            medianprops={"color": "tab:red", "linewidth": 2},
        )
        for i, xs in enumerate(data, start=1):
            jitter = [i + rng.uniform(-0.22, 0.22) for _ in xs]
            ax.scatter(xs, jitter, s=4, alpha=0.45, color="tab:blue", linewidths=0)
        ax.set_yticks(range(1, len(labels) + 1), labels, fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel(
            "microseconds (log scale); box: quartiles, whiskers: p1-p99, red: median", fontsize=8
        )
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", which="both", alpha=0.3)
    fig.suptitle(f"pylock latency distributions ({cmd})", fontsize=11)
    fig.savefig(path, dpi=110)
    plt.close(fig)
