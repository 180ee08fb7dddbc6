"""What the GPU diagnostics scripts share: `--out FILE` taken from argv, and one fidelity
cell (`cell=NAME`, from benchmarks/results/fidelity/plan.json) built on the engine."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def pop_out(argv: list[str]) -> tuple[Path | None, list[str]]:
    """(the --out path or None, the other arguments)."""
    if "--out" not in argv:
        return None, argv
    i = argv.index("--out")
    return Path(argv[i + 1]), argv[:i] + argv[i + 2:]


def cell_engine(argv: list[str], default: str):
    """(cell, its engine config, model spec, engine parts) of `cell=NAME` (default `default`)."""
    from testbed import assemble
    from testbed.config import compose
    from testbed.fidelity.cells import read_plan

    name = dict(a.split("=", 1) for a in argv).get("cell", default)
    cell = next(c for c in read_plan(ROOT / "benchmarks/results/fidelity/plan.json") if c.name == name)
    cfg = compose(cell.overrides + ["backend=engine"])
    spec = assemble.model_spec(cfg)
    return cell, cfg, spec, assemble.engine_parts(cfg)
