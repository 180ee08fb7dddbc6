"""CI's fidelity guard: replay the committed engine runs in the simulator and compare each
cell's headline errors with the committed report's. A change to the scheduler, a driver or
the cost model that makes any of them worse by more than the margin fails."""
from __future__ import annotations

import json
from pathlib import Path

from testbed.fidelity.compare import HEADLINE
from testbed.fidelity.report import evaluate


def check(out: Path, cells, margin: float) -> int:
    """0 when every committed cell among `cells` was replayed and none grew worse; 1 otherwise
    (a committed cell whose engine runs are gone fails too: a guard that compares nothing
    must not pass)."""
    f = out / "fidelity.json"
    if not f.is_file():
        raise SystemExit(f"error: {f}: no committed report to check against; write one with "
                         f"`python -m testbed.fidelity report out={out}`")
    committed = json.loads(f.read_text())["cells"]
    now = evaluate(out, cells)
    worse, n = [], 0
    lost = [name for name, c in now.items() if "errors" in committed.get(name, {}) and "errors" not in c]
    for name, c in now.items():
        if "errors" not in c or "errors" not in committed.get(name, {}):
            continue
        for k in HEADLINE:
            if k not in c["errors"] or k not in committed[name]["errors"]:
                continue
            a, b = abs(c["errors"][k]["error"]), abs(committed[name]["errors"][k]["error"])
            n += 1
            if a > b + margin:
                worse.append(f"{name} {k}: error {a:.1%}, committed {b:.1%} (+{margin:.1%} allowed)")
    for w in worse:
        print(f"fidelity: {w}")
    for name in lost:
        print(f"fidelity: {name}: the committed report has its errors but its engine runs are missing from {out / 'runs'}")
    print(f"fidelity check: {n} errors of {len(now)} cells compared, {len(worse)} beyond the committed figure + {margin:.1%}"
          + (f", {len(lost)} committed cells without engine runs" if lost else "")
          + ("" if n else "; nothing was compared"))
    return 1 if worse or lost or not n else 0
