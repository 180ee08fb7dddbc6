"""Do serving steps take longer than the profile's synthetic steps because of where their KV
sits? Runs fidelity cells on the engine, keeping a sample of its decode and mixed steps' batches
exactly as launched (their KV slots included), then re-times each as the profiler times a shape
(device held busy until the step is enqueued) with its KV laid out four ways:
  served   the slots the step used in the run
  pending  the same, its decode rows' input ids gathered from the last step's tokens, as in the run
  synth    the profiler's layout (synthetic_batch, the profiler's interleave), rows in batch order
  sorted   the profiler's layout, rows sorted by context (the profiler's spread/skewed shapes are)
  high     the profiler's layout moved up to the served batch's lowest slot
and writes one row per step with the layout's shape (span of slots, share of consecutive slots).

    python benchmarks/diag_decode_layout.py [cells=A,B] [every=4] [min_rows=33] [OVERRIDE...] [--out FILE.json]

Other KEY=VALUE arguments are appended to each cell's overrides (a CPU smoke run:
model=smollm2_135m engine.device=cpu trace.num_requests=6 min_rows=2).
"""
from __future__ import annotations

import gc
import json
import sys

from diag_cell import ROOT, pop_out

DEFAULT_CELLS = "qwen3_0_6b-prefill_first-azure_conv-high,qwen3_0_6b-chunked-mooncake_conversation-high"
MIN_DECODE_ROWS = 33  # the decode graphs the report prices short or long


def layout_stats(kv_indices, kv_indptr) -> dict:
    import numpy as np
    idx = np.asarray(kv_indices, np.int64)
    ptr = np.asarray(kv_indptr, np.int64)
    d = np.diff(idx)
    inside = np.ones(len(d), bool)
    inside[ptr[1:-1] - 1] = False  # a row's last slot to the next row's first is no step within a row
    return {"min_slot": int(idx.min()), "max_slot": int(idx.max()),
            "consecutive": float((d[inside] == 1).mean()) if inside.any() else 1.0}


def main(argv):
    import numpy as np
    import torch

    from testbed import assemble
    from testbed.config import compose
    from testbed.engine.batch_builder import HostBatch
    from testbed.engine.executor import EngineExecutor
    from testbed.engine.forward_batch import ForwardBatch
    from testbed.engine.profiler import DECODE_INTERLEAVE, _sleep_cycles_per_s, time_host_batch
    from testbed.engine.synthetic_batch import synthetic_host_batch
    from testbed.fidelity.cells import read_plan

    out, argv = pop_out(argv)
    args = dict(a.split("=", 1) for a in argv)
    names = args.get("cells", DEFAULT_CELLS).split(",")
    every = int(args.pop("every", 4))
    min_rows = int(args.pop("min_rows", MIN_DECODE_ROWS))
    args.pop("cells", None)
    extra = [f"{k}={v}" for k, v in args.items()]
    plan = {c.name: c for c in read_plan(ROOT / "benchmarks/results/fidelity/plan.json")}
    parts = None
    rows = []
    for name in names:
        cfg = compose(plan[name].overrides + ["backend=engine"] + extra)
        spec = assemble.model_spec(cfg)
        parts = parts or assemble.engine_parts(cfg)
        driver = assemble.build_run(cfg, parts).driver
        ex = driver.executor
        kept, seen = [], [0]
        launch_host = ex.launch_host

        def keep(hb, sampling, *a, _launch=launch_host, **k):
            step = seen[0]
            seen[0] += 1
            e = (hb.fb.qo_indptr[1:] - hb.fb.qo_indptr[:-1]).numpy()
            wanted = (e == 1).all() and len(e) >= min_rows or (e > 1).any() and (e == 1).any()
            if wanted and step % every == 0:
                f = hb.fb
                kept.append((step, {k2: getattr(f, k2).clone() for k2 in
                                    ("input_ids", "positions", "qo_indptr", "kv_indptr", "kv_indices",
                                     "out_cache_loc")}, f.is_decode))
            return _launch(hb, sampling, *a, **k)

        ex.launch_host = keep
        gc.collect()
        gc.freeze()
        driver.run()
        gc.unfreeze()
        dur = np.asarray(driver.steps.cols["duration_s"], float)
        probe = EngineExecutor(parts.model, parts.device, cfg.scheduler.max_running, None, None, parts.graphs,
                               parts.pieces)
        cps = _sleep_cycles_per_s(parts.device) if parts.device.type == "cuda" else None
        empty = np.zeros(0, np.int64)
        for step, t, is_decode in kept:
            qo, kv = t["qo_indptr"].numpy(), t["kv_indptr"].numpy()
            ext = np.diff(qo).astype(np.int64)
            ctx = np.diff(kv).astype(np.int64)
            rows_b = np.arange(len(ext), dtype=np.int64)

            def host(fb):
                return HostBatch(fb, empty, empty, rows_b, rows_b, np.zeros(len(ext), np.int64))

            served = host(ForwardBatch(**t, is_decode=is_decode, page_size=cfg.engine.page_size))
            # as the step ran: every decode row's input id read from the last step's sampled tokens
            pend = np.flatnonzero(ext == 1)
            tok = (qo[1:] - 1)[pend].astype(np.int64)
            pending = HostBatch(served.fb, tok, pend.astype(np.int64), rows_b, rows_b, np.zeros(len(ext), np.int64))
            synth = synthetic_host_batch(ext, ctx - ext, parts.slots, cfg.engine.page_size, spec.vocab_size,
                                         interleave=DECODE_INTERLEAVE)
            order = np.argsort(ctx, kind="stable")
            srt = synthetic_host_batch(ext[order], (ctx - ext)[order], parts.slots, cfg.engine.page_size,
                                       spec.vocab_size, interleave=DECODE_INTERLEAVE)
            st = layout_stats(t["kv_indices"].numpy(), kv)
            top = int(synth.fb.kv_indices.max()) + 1
            shift = min(st["min_slot"], parts.slots - top)
            f = synth.fb
            high = host(ForwardBatch(f.input_ids, f.positions, f.qo_indptr, f.kv_indptr, f.kv_indices + shift,
                                     f.out_cache_loc + shift, f.is_decode, f.page_size))
            row = {"cell": name, "step": step, "decode": bool(is_decode), "reqs": int(len(ext)),
                   "tokens": int(ext.sum()), "kv_tokens": int(ctx.sum()), "measured_s": float(dur[step]),
                   **st, "synth_layout": layout_stats(f.kv_indices.numpy(), kv)["consecutive"]}
            row["extend"], row["context"] = ext.tolist(), ctx.tolist()
            for label, hb in (("served", served), ("pending", pending), ("synth", synth), ("sorted", srt),
                              ("high", high)):
                row[label + "_s"] = time_host_batch(probe, hb, 3, cps)["device_s"]
            rows.append(row)
            if cps is not None:
                torch.cuda.synchronize()
        for kind in (True, False):
            r = [x for x in rows if x["cell"] == name and x["decode"] == kind]
            if r:
                med = {k: float(np.median([x[k + "_s"] / x["measured_s"] for x in r]))
                       for k in ("served", "pending", "synth", "sorted", "high")}
                print(f"{name} {'decode' if kind else 'mixed'}: {len(r)} steps re-timed; over measured, median: "
                      + ", ".join(f"{k} {v:.3f}" for k, v in med.items()), flush=True)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"cells": names, "rows": rows}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
