"""The report's account of each cell that misses the bar: which headline metrics, how far the
engine itself moved between its two runs, how fast its host ran against the profile, and which
steps the simulator prices or places differently from the engine (fidelity.json's figures
for the cell, read back; nothing is re-run)."""
from __future__ import annotations

from testbed.fidelity.compare import HEADLINE, label

BAR = 0.05  # the acceptance bar on every headline metric
HOST_OFF = 0.15  # a run's host this far from the profile's speed (1.00) is named
STEP_OFF = 0.02  # a step kind priced or placed this far from the engine's is named
MIN_SHARE = 0.05  # ... when it holds this share of the cell's steps


def missed(c: dict, bar: float = BAR) -> list[str]:
    """The headline metrics of a cell whose error is beyond the bar."""
    e = c.get("errors", {})
    return [k for k in HEADLINE if k in e and e[k]["error"] is not None and abs(e[k]["error"]) > bar]


def findings(c: dict, keys: list[str]) -> list[str]:
    """What the cell's figures show about its miss on `keys`, one line each."""
    e, out = c["errors"], []
    for k in keys:
        sp = e[k]["spread"]
        if sp is not None and sp >= abs(e[k]["error"]) / 2:
            out.append(f"the engine's own two runs differ by {sp:.1%} on {label(k)}: at least half the error")
    speeds = [v for v in c.get("host_ratio", []) if v is not None]
    if any(abs(v - 1) > HOST_OFF for v in speeds):
        out.append("the engine's host took " + " / ".join(f"{v:.2f}" for v in speeds) + "x the profile's host "
                   "time for the same steps in its runs (the simulator replays at 1.00x)")
    steps = c.get("steps") or []
    eng = {s["kind"]: s for s in steps if s["who"] == "engine"}
    sim = {s["kind"]: s for s in steps if s["who"] == "sim"}
    total = sum(s["steps"] for s in eng.values()) or 1
    for kind, s in eng.items():
        if kind in sim and s["interval"] and s["steps"] / total >= MIN_SHARE:
            r = sim[kind]["interval"] / s["interval"]
            if abs(r - 1) >= STEP_OFF:
                out.append(f"{kind} steps add {r:.3f}x the engine's time to the timeline in the simulator "
                           f"({sim[kind]['interval']:.2f} against {s['interval']:.2f} ms a step, {s['steps']:,} steps)")
    dev = c.get("device_steps") or []
    n = sum(d["steps"] for d in dev) or 1
    off = [d for d in dev if d["steps"] / n >= MIN_SHARE and abs(d["time_ratio"] - 1) >= STEP_OFF]
    for d in sorted(off, key=lambda d: -abs(d["time_ratio"] - 1)):
        out.append(f"{d['kind']} steps of {d['requests']} requests are priced at {d['time_ratio']:.3f} of their "
                   f"measured device time ({d['steps']:,} steps, both runs)")
    if not out:
        out.append(f"no step kind is {STEP_OFF:.0%} or more off and the engine repeats to under half the error")
    return out


def misses_section(res: dict, bar: float = BAR) -> list[str]:
    """Markdown lines: every cell beyond the bar with its findings; empty when none misses."""
    cells = {n: c for n, c in res.items() if "errors" in c and missed(c, bar)}
    if not cells:
        return []
    lines = [f"## Cells beyond {bar:.0%}: what their figures show", "",
             f"For each cell with a headline error beyond {bar:.0%}: the engine's own spread where it is at least "
             f"half the error, the runs' host time per step where it is more than {HOST_OFF:.0%} from the profile's fit, the step "
             f"kinds (holding {MIN_SHARE:.0%} or more of the steps) whose time on the timeline or whose priced device "
             f"time is {STEP_OFF:.0%} or more from the engine's.", ""]
    for name, c in cells.items():
        e = c["errors"]
        keys = missed(c, bar)
        lines.append(f"- **{name}**: " + ", ".join(f"{label(k)} {e[k]['error']:+.1%}" for k in keys))
        lines += [f"  - {f}" for f in findings(c, keys)]
    return lines + [""]
