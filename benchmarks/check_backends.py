"""GPU check: the flashinfer attention backend and the fused Triton kernels against the torch
reference (torch attention, torch ops), same dummy weights, same batches (prefill with cached
prefixes and mixed lengths, then decode). Prints and writes the relative error of the logits
of each (attention, kernels) pair against the reference.

    python benchmarks/check_backends.py --model qwen3_0_6b --out benchmarks/results/backends_h200.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    import numpy as np
    import torch
    from testbed.engine.forward_batch import ForwardBatch
    from testbed.engine.model import build_model, load_weights
    from testbed.modelspec import load_model_spec

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3_0_6b")
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--layers", type=int, default=0, help="cut the model to this many layers (0: all)")
    ap.add_argument("--prefill-backend", default="fa2", help="flashinfer prefill template: fa2 | fa3")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    spec = load_model_spec(f"hf/{a.model}.json")
    if a.layers:
        spec = dataclasses.replace(spec, num_layers=a.layers)
    dev = torch.device("cuda")
    models = {}
    ref_name = "torch+torch"
    for name in (ref_name, "flashinfer+torch", "torch+triton", "flashinfer+triton"):
        attention, kernels = name.split("+")
        options = {"prefill_backend": a.prefill_backend} if attention == "flashinfer" else None
        m = build_model(spec, torch.bfloat16, dev, attention, kernels=kernels, attention_options=options)
        load_weights(m, "dummy", seed=0)
        m.create_kv_pool(8192, a.page_size)
        models[name] = m
    rng = np.random.default_rng(0)
    P = a.page_size
    # three requests: two share a cached prefix of 64 tokens computed in a first step
    lens = [200, 37, 129]
    prompts = [rng.integers(0, 10000, n) for n in lens]
    prompts[1][:32] = prompts[0][:32]
    slot_next = [0]

    def slots(n):  # page-aligned raw slots
        pages = -(-n // P)
        base = slot_next[0]
        slot_next[0] += pages * P
        return np.arange(base, base + pages * P)[:n]

    kv = [slots(n + 8) for n in lens]  # room for the decode steps
    kv[1][:32] = kv[0][:32]  # shared prefix pages (32 is a multiple of every page size used)

    def batch(items):  # items: (req, start, n)
        ids, pos, qo, kvi, kvp, loc = [], [], [0], [], [0], []
        for r, c, n in items:
            ids += list(seq[r][c:c + n]); pos += list(range(c, c + n)); qo.append(qo[-1] + n)
            kvi += list(kv[r][:c + n]); kvp.append(kvp[-1] + c + n); loc += list(kv[r][c:c + n])
        t = lambda x, dt: torch.tensor(x, dtype=dt)
        return ForwardBatch(t(ids, torch.int64), t(pos, torch.int64), t(qo, torch.int32), t(kvp, torch.int32),
                            t(kvi, torch.int32), t(loc, torch.int32), all(n == 1 for _, _, n in items), P).to(dev)

    seq = [list(p) for p in prompts]
    results = []
    logits = {}
    for name, m in models.items():
        out = [m(batch([(0, 0, 200)])), m(batch([(1, 32, 5), (2, 0, 129)]))]
        logits[name] = out
    def compare(step, out):
        ref = out[ref_name].float()
        for name, got in out.items():
            if name != ref_name:
                got = got.float()
                results.append({"step": step, "attention+kernels": name,
                                "rel_error": ((got - ref).norm() / ref.norm()).item(),
                                "argmax_equal": float((got.argmax(-1) == ref.argmax(-1)).float().mean())})

    for i in range(2):
        compare(f"prefill {i}", {name: out[i] for name, out in logits.items()})
    # decode steps: every request appends one (random) token over its whole context
    for step in range(4):
        items = []
        for r in range(3):
            c = len(seq[r])
            seq[r].append(int(rng.integers(0, 10000)))
            items.append((r, c, 1))
        fb = batch(items)
        compare(f"decode {step}", {name: m(fb) for name, m in models.items()})
    for r in results:
        print(f"{a.model} page_size={P} {r['step']:<10} {r['attention+kernels']:<18} "
              f"rel_error {r['rel_error']:.2e} argmax_equal {r['argmax_equal']:.2f}")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps({"model": a.model, "page_size": P, "layers": a.layers or "all",
                                           "prefill_backend": a.prefill_backend, "reference": ref_name,
                                           "results": results}, indent=2))


if __name__ == "__main__":
    main()
