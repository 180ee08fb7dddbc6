"""Decode CUDA graphs on the GPU: their logits against the eager forward for batches that fill
a captured size and batches that are padded up to one, run one after another from the
largest down (so each padded step finds the rows beyond it left by a larger one), and the
K/V slots each step must not touch: the previous step's slots outside this step's
out_cache_loc. Exits 1 when the logits disagree or a slot changed.

    python benchmarks/check_decode_graphs.py model=qwen3_0_6b model.weights=dummy [--out FILE.json]
"""
from __future__ import annotations

import json
import sys

from diag_cell import pop_out

BATCHES = [100, 64, 33, 16, 13, 8, 5, 3, 1]  # 100, 33, 13, 5, 3 run padded
CONTEXT = 700


def main(argv):
    import torch

    from testbed import assemble
    from testbed.config import compose
    from testbed.engine.synthetic_batch import synthetic_host_batch

    out, argv = pop_out(argv)
    cfg = compose(["backend=engine"] + argv)
    spec = assemble.model_spec(cfg)
    parts = assemble.engine_parts(cfg)
    graphs, model, dev = parts.graphs, parts.model, parts.device
    if graphs is None:
        raise SystemExit("check_decode_graphs: the engine built no decode graphs (engine.cuda_graph_max_bs=0?)")
    pool = model.attn_backend.pool
    ok, rows, prev_loc = True, [], None
    for k, B in enumerate(BATCHES):
        hb = synthetic_host_batch([1] * B, [CONTEXT - 1] * B, parts.slots, cfg.engine.page_size, spec.vocab_size,
                                  seed=k, interleave=0.5)
        fb = hb.fb.to(dev)
        with torch.inference_mode():
            want = model(fb).float()
            # the slots the last step wrote and this one does not: a padding row must not write them
            keep = None
            if prev_loc is not None:
                mine = set(hb.fb.out_cache_loc.tolist())
                keep = torch.tensor([s for s in prev_loc if s not in mine], dtype=torch.int64, device=dev)
                before = [pool.k[0][keep].clone(), pool.v[-1][keep].clone()]
            got = graphs.run(fb).float()
            torch.cuda.synchronize(dev)
            untouched = True
            if keep is not None and keep.numel():
                untouched = bool(torch.equal(before[0], pool.k[0][keep]) and torch.equal(before[1], pool.v[-1][keep]))
        rel = float((got - want).abs().max() / want.abs().max())
        agree = float((got.argmax(-1) == want.argmax(-1)).float().mean())
        good = rel < 2e-2 and agree >= 0.99 and untouched
        ok &= good
        size = next(s for s in graphs.sizes if s >= B)
        rows.append({"batch": B, "graph_size": size, "max_rel_diff": rel, "argmax_agree": agree,
                     "other_slots_untouched": untouched, "ok": good})
        print(json.dumps(rows[-1]), flush=True)
        prev_loc = hb.fb.out_cache_loc.tolist()
    print(f"decode graphs: {'agree' if ok else 'DISAGREE'} with the eager forward over {len(rows)} batches")
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"model": cfg.model.name, "ok": bool(ok), "batches": rows}, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
