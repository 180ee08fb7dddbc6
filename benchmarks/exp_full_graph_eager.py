"""Experiment (issues #17, #11): an eager step captured whole, attention included, as one CUDA
graph, against the piecewise graphs the engine runs (testbed/engine/piecewise_graphs.py).

Why: a piecewise eager step enqueues L + 1 graphs and L attention calls; for a Qwen3-0.6B
prefill of 42 tokens that took 1.67 ms of host time against 2.07 ms of device time
(benchmarks/results/piecewise/), and a light-load request's TTFT is that launch plus the
schedule plus the device: the part that follows the host's speed, which moves by ~1.5x on the
lent machine (benchmarks/results/fidelity/start8/README.md). flashinfer's batch-prefill wrapper
has a CUDA-graph mode (fixed batch size, metadata in fixed buffers, planned on the host before
each replay), so the whole step can be one graph per (padded tokens, request slots): the
batch's requests, then one padding request holding the padding rows (over as many scratch
slots), then empty requests (no rows) up to the slots. Its plan differs from the eager one: the
query tile comes from the most rows one request could have, not from the batch's mean, and
the KV is always split, so its device time is measured here too. The graph ends with the LM
head on each slot's last row (a fixed index buffer), which the piecewise path runs eagerly.
The graphs are the engine's (testbed/engine/whole_graphs.py, engine.whole_step_graphs, which
gives them prefill-only steps); here every shape, mixed ones too, runs in one.

For each shape: host time to enqueue the step (device held busy, so the enqueue never waits),
the step's device time (CUDA events, the device held until it is enqueued), medians; and the
logits of the two paths compared. Writes one JSON (GPU only).

    python benchmarks/exp_full_graph_eager.py --out FILE [--model qwen3_0_6b] [--repeats 20]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (label, extend lengths, cached lengths): light-load prefills, a chunk over a prefix, mixed steps
SHAPES = [
    ("prompt 10", [10], [0]),
    ("prompt 42", [42], [0]),
    ("prompt 120", [120], [0]),
    ("prompt 400", [400], [0]),
    ("chunk 300 over 1000", [300], [1000]),
    ("chunk 200 + 3 decodes", [200, 1, 1, 1], [0, 400, 800, 1600]),
    ("chunk 100 + 7 decodes", [100] + [1] * 7, [500] + [300 + 200 * i for i in range(7)]),
    ("chunk 448 + 14 decodes", [448] + [1] * 14, [2048] + [200 + 150 * i for i in range(14)]),
    ("prompts 4 x 60", [60] * 4, [0] * 4),
]
SLOTS = (2, 4, 8, 16)  # request slots of a whole-step graph: the batch and its padding request fit
MAX_PAGES = 1 << 16  # the graphs' KV page-id buffer: any shape above fits


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3_0_6b")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    import torch

    from probe_engine import probe_engine
    from testbed.engine.synthetic_batch import synthetic_host_batch
    from testbed.engine.whole_graphs import INT_WORKSPACE_BYTES, WholeStepGraph

    spec, st, parts, ex, cps = probe_engine(a.model)
    pw, backend = parts.pieces, parts.model.attn_backend
    pool = torch.cuda.graph_pool_handle()
    kv_indices = torch.empty(MAX_PAGES, dtype=torch.int32, device=parts.device)
    int_workspace = torch.empty(INT_WORKSPACE_BYTES, dtype=torch.uint8, device=parts.device)
    t0 = time.perf_counter()
    graphs = {}
    rows = []

    def measure(fn):
        launch, device = [], []
        for _ in range(a.repeats):
            torch.cuda._sleep(int(0.02 * cps))  # the device busy: the enqueue never waits
            t = time.perf_counter()
            fn()
            launch.append(time.perf_counter() - t)
            torch.cuda.synchronize()
        for _ in range(a.repeats):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(int(0.02 * cps))
            e0.record()
            fn()
            e1.record()
            torch.cuda.synchronize()
            device.append(e0.elapsed_time(e1) / 1e3)
        return float(np.median(launch)), float(np.median(device))

    for label, ext, cac in SHAPES:
        hb = synthetic_host_batch(np.array(ext), np.array(cac), parts.slots, st.page_size, spec.vocab_size)
        fb = ex._to_device(hb)[0]
        T = fb.num_tokens
        s = pw.size_for(T)
        slots = next(k for k in SLOTS if k >= len(ext) + 1)
        if (s, slots) not in graphs:
            with torch.inference_mode():
                graphs[(s, slots)] = WholeStepGraph(pw, s, slots, int_workspace, kv_indices, pool)
        full = graphs[(s, slots)]
        with torch.inference_mode():
            ref = pw.run(fb).float()
            got = full.run(fb).float()
            rel = float((got - ref).abs().max() / ref.abs().max())
            agree = float((got.argmax(-1) == ref.argmax(-1)).float().mean())
            pl, pd = measure(lambda: pw.run(fb))
            fl, fd = measure(lambda: full.run(fb))
        with torch.inference_mode():  # where a step's host time goes
            parts_s = {"full_prepare": measure(lambda: full.prepare(fb))[0],
                       "replay": measure(full.graph.replay)[0],
                       "piecewise_head": measure(lambda: pw.model.head(pw.x[:s], pw.res[:s], fb.last_token_index()))[0],
                       "piecewise_prepare": measure(lambda: backend.prepare(fb))[0]}
        row = {"shape": label, "extend": ext, "cached": cac, "tokens": T, "size": s, "slots": slots,
               "piecewise_launch_s": pl, "piecewise_device_s": pd, "full_launch_s": fl, "full_device_s": fd,
               "logits_max_rel_diff": rel, "argmax_agree": agree, "launch_parts_s": parts_s}
        rows.append(row)
        print(f"{label:24s} T {T:4d} size {s:4d} slots {slots:2d}  launch {pl * 1e3:6.3f} -> {fl * 1e3:6.3f} ms  "
              f"device {pd * 1e3:6.3f} -> {fd * 1e3:6.3f} ms  rel {rel:.1e} argmax {agree:.2f}  "
              + " ".join(f"{k} {v * 1e3:.3f}" for k, v in parts_s.items()), flush=True)
        Path(a.out).write_text(json.dumps({"model": a.model, "repeats": a.repeats, "graphs": len(graphs),
                                           "elapsed_s": time.perf_counter() - t0, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
