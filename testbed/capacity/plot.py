"""capacity.png: goodput (above) and SLO attainment (below) against the request rate, a line
per policy through the rates tried, each policy's answer marked (dotted)."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd


def plot(trials: pd.DataFrame, answers: dict, target: float, title: str, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(7, 6.5))
    for i, (policy, g) in enumerate(trials.groupby("policy", sort=False)):
        g = g.sort_values("rate")
        colour = f"C{i}"
        top.plot(g["rate"], g["request_goodput"], "o-", color=colour, label=policy)
        bottom.plot(g["rate"], g["slo_attainment"], "o-", color=colour, label=policy)
        rate = answers[policy]["rate"]
        if rate is not None:
            for ax in (top, bottom):
                ax.axvline(rate, color=colour, ls=":", lw=1)
    bottom.axhline(target, color="0.3", ls="--", lw=1, label=f"target {target:.0%}")
    top.set_ylabel("goodput (req/s within SLO)")
    bottom.set_ylabel("SLO attainment")
    bottom.set_xlabel("request rate, trace.rate (req/s)")
    bottom.set_ylim(-0.02, 1.02)
    for ax in (top, bottom):
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    top.set_title("\n".join(textwrap.wrap(title, 90)), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
