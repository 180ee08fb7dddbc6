"""Experiment (issue #11): do served mixed steps run as long when replayed alone, and does the KV
slots' layout move them?

The device model prices some served mixed steps (a prefill chunk beside decodes) 4-10% short
(chunked-mooncake_conversation-high's chunk beside 16 decodes of up to 27k tokens: 0.90), where
the profiler's grid samples of like shapes come out nearer 0.95-1.0. Either the shapes are
what the grid lacks (then a replay of the served batch alone runs as long as it did served), or
the served step differs in what the grid does not vary: the KV slots' layout. The profiler lays
a context out as one run of slots (a decode row's last 20% interleaved with the other rows'),
a long-running engine's pool hands out slots freed in any order.

This replays the served batches of benchmarks/results/fidelity/experiments/mixed_layout_batches.json
(picked from the committed runs' r1, evenly over the committed profile's predicted / measured
ratio; beside them decode_first-azure_conv-high's decode graphs of 89-96 and 153-176 rows, priced
2-4% short) on the engine as the profiler builds it, each in three layouts: the profiler's; every
slot of the batch moved by one random permutation of the pool (scattered); whole 512-slot
blocks permuted (a chunk's slots together, the chunks apart). Device time as the profiler
times it (the median of repeats with the device held until the step is enqueued), and the
attention kernels' share from the torch profiler. Writes one JSON (GPU only).

    python benchmarks/exp_mixed_layout.py --out FILE [--batches FILE] [--repeats 5] [--limit N]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BATCHES = ROOT / "benchmarks/results/fidelity/experiments/mixed_layout_batches.json"
BLOCK = 512


def relaid(hb, mapping: np.ndarray):
    """hb with every KV slot s moved to mapping[s] (a bijection of the pool: rows stay apart)."""
    import torch
    fb = hb.fb
    m = torch.from_numpy(mapping.astype(np.int32))
    fb2 = dataclasses.replace(fb, kv_indices=m[fb.kv_indices.long()], out_cache_loc=m[fb.out_cache_loc.long()])
    return dataclasses.replace(hb, fb=fb2)


def layouts(num_slots: int, seed: int) -> dict[str, np.ndarray | None]:
    rng = np.random.default_rng(seed)
    blocks = num_slots // BLOCK
    head = (rng.permutation(blocks)[:, None] * BLOCK + np.arange(BLOCK)).reshape(-1)
    block_map = np.concatenate([head, np.arange(blocks * BLOCK, num_slots)])
    return {"profiler": None, "scattered": rng.permutation(num_slots), "blocks512": block_map}


def attention_share(ex, hb, sampling, replays: int = 3) -> tuple[float, float]:
    """(attention kernels' seconds a step, all kernels' seconds a step) under the torch profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            ex.collect(ex.launch_host(hb, sampling))
        torch.cuda.synchronize()
    attn = total = 0.0
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
        if not t or e.key.startswith("cuda") or "Memcpy" in e.key or "Memset" in e.key:
            continue
        total += t
        if "Prefill" in e.key or "Decode" in e.key or "Attention" in e.key or "MergeStates" in e.key:
            attn += t
    return attn / replays / 1e6, total / replays / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3_0_6b")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--batches", type=Path, default=BATCHES)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    from probe_engine import probe_engine
    from testbed.engine.profiler import DECODE_INTERLEAVE, time_host_batch
    from testbed.engine.synthetic_batch import greedy_sampling, synthetic_host_batch

    batches = json.loads(a.batches.read_text())["batches"][: a.limit]
    spec, s, parts, ex, cps = probe_engine(a.model)
    maps = layouts(parts.slots, seed=0)
    rows = []
    for b in batches:
        hb0 = synthetic_host_batch(b["extend"], b["cached"], parts.slots, s.page_size, spec.vocab_size,
                                   interleave=DECODE_INTERLEAVE, pending=True)
        sampling = greedy_sampling(hb0.fb.batch_size)
        row = {k: b[k] for k in ("cell", "run", "step", "served_s", "predicted_s")}
        row["reqs"], row["tokens"] = len(b["extend"]), int(sum(b["extend"]))
        row["kv_tokens"] = row["tokens"] + int(sum(b["cached"]))
        for name, mp in maps.items():
            hb = hb0 if mp is None else relaid(hb0, mp)
            t = time_host_batch(ex, hb, a.repeats, cps)
            attn, total = attention_share(ex, hb, sampling)
            row[name] = {"device_s": t["device_s"], "free_s": t["free_s"], "attention_s": attn, "kernels_s": total}
        rows.append(row)
        print(f"{b['cell'][11:]:38s} step {b['step']:5d} reqs {row['reqs']:3d} kv {row['kv_tokens']:7d} "
              f"served {b['served_s'] * 1e3:6.2f} model {b['predicted_s'] * 1e3:6.2f} | " + "  ".join(
                  f"{n} {row[n]['device_s'] * 1e3:6.2f} (attn {row[n]['attention_s'] * 1e3:5.2f})" for n in maps),
              flush=True)
    Path(a.out).write_text(json.dumps({"model": a.model, "repeats": a.repeats, "batches": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
