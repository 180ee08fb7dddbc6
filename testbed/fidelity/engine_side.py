"""The engine side of the experiment (a GPU machine): every cell of the plan run `repeats`
times, back to back, on one model load per model and engine settings (warmed up once; a cell
whose overrides change the engine's settings gets its own), each run into
DIR/runs/<cell>/r<k>/ (requests.parquet, steps.parquet, summary.json; no output ids), and the
machine start they ran on into DIR/runs/<cell>/machine.json (cells of one plan may be run on
several starts)."""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

log = logging.getLogger(__name__)


def run_engine_cells(cells, out: Path, repeats: int = 2) -> list[str]:
    """Returns the failed runs (name: error); the others are written whatever happens to them."""
    import gc

    import torch

    from testbed import assemble
    from testbed.config import compose
    from testbed.engine.profiler import machine_info
    from testbed.run import run

    machine = json.dumps(machine_info(torch.device("cuda" if torch.cuda.is_available() else "cpu")), indent=1) + "\n"
    failed = []
    parts, parts_key = None, None
    for cell in cells:
        cfg = compose(cell.overrides + ["backend=engine"])
        key = (cell.model, repr(assemble.engine_settings(cfg, assemble.model_spec(cfg))))  # settings omit the model
        if parts_key != key:
            parts = None  # free the last model before loading the next
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            parts = assemble.engine_parts(cfg)
            parts_key = key
        (out / "runs" / cell.name).mkdir(parents=True, exist_ok=True)
        (out / "runs" / cell.name / "machine.json").write_text(machine)
        for k in range(1, repeats + 1):
            d = out / "runs" / cell.name / f"r{k}"
            t0 = time.perf_counter()
            try:
                s = run(cfg, str(d), engine_parts=parts, keep_ids=False, print_table=False)
                m = s["metrics"]
                print(f"{cell.name} r{k}: {m['completed']} done in {m['duration_s']:.1f} s, TTFT mean "
                      f"{m['mean_ttft_ms']:.1f} ms, TPOT mean {m['mean_tpot_ms']:.2f} ms "
                      f"(wall {time.perf_counter() - t0:.1f} s)", flush=True)
            except Exception as e:  # keep going: the other cells are worth their device time
                failed.append(f"{cell.name} r{k}: {type(e).__name__}: {e}")
                print(f"FAILED {failed[-1]}", flush=True)
    return failed
