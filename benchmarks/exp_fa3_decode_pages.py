"""Experiment (issue #17): the tensor-core decode on flashinfer's fa3 (Hopper) template with
larger KV pages, against the default (fa2 template, 1-slot pages), on bench_engine.py's workload.

The engine pins the tensor-core decode to the fa2 template (fa3 at 1-slot pages measured 3x
slower); this script runs `python -m testbed.run` with that pin patched in its own process, so
the product code is unchanged until the experiment says the change pays. Prints one line per
run and writes a JSON of the runs (GPU only).

    python benchmarks/exp_fa3_decode_pages.py --model qwen3_0_6b --out FILE [--configs fa2:1,fa3:16,fa3:64]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_engine import WORKLOAD  # noqa: E402

# runs testbed.run with the tensor-core decode on the template named by $DECODE_TEMPLATE
PATCHED_RUN = """\
import os, runpy, sys
from testbed.engine.attention import flashinfer_backend as fb
template = os.environ["DECODE_TEMPLATE"]
fb.FlashInferAttentionBackend._decode_backend = lambda self: {"backend": template} if self._tensor_cores else {}
sys.argv[0] = "testbed.run"
runpy.run_module("testbed.run", run_name="__main__", alter_sys=True)
"""


def run(model: str, template: str, page_size: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        args = [sys.executable, "-c", PATCHED_RUN, "backend=engine", f"model={model}", "model.weights=dummy",
                "engine.overlap=true", "progress=false", *WORKLOAD, f"engine.page_size={page_size}",
                "engine.decode_tensor_cores=true", f"engine.prefill_backend={template}", f"hydra.run.dir={d}"]
        p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True,
                           env={**os.environ, "DECODE_TEMPLATE": template})
        if p.returncode != 0:
            return {"template": template, "page_size": page_size, "error": p.stderr[-1500:]}
        s = json.loads((Path(d) / "summary.json").read_text())
    m = s["metrics"]
    return {"model": model, "template": template, "page_size": page_size, "output_throughput": m["output_throughput"],
            "duration_s": m["duration_s"], "output_tokens": m["total_output_tokens"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3_0_6b")
    ap.add_argument("--configs", default="fa2:1,fa3:16,fa3:64,fa2:1,fa3:16,fa3:64")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rows = []
    for c in a.configs.split(","):
        template, page = c.split(":")
        row = run(a.model, template, int(page))
        rows.append(row)
        print(json.dumps(row)[:400], flush=True)
        Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
