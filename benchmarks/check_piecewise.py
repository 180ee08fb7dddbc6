"""Piecewise CUDA graphs on the GPU: their logits against the eager forward, their capture
time and memory, and the host launch time of eager steps with and without them; and the eager
forward's attention replayed from the first layer's recorded call against every layer through
flashinfer's run() (bit-identical). Exits 1 when the logits disagree.

    python benchmarks/check_piecewise.py model=qwen3_0_6b model.weights=dummy [--out FILE.json]
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time

from diag_cell import pop_out

# (extend_lens, cached_lens): a chunk beside decodes, a long chunk beside many decodes, one
# fresh prompt, four chunks over cached prefixes, decode beyond the graphs
SHAPES = [([37] + [1] * 5, [0] + [20] * 5), ([450] + [1] * 80, [0] + [2500] * 80), ([2000], [0]),
          ([512] * 4, [1024] * 4), ([1] * 300, [64] * 300)]


_replays = [0]


def count_replays() -> int:
    """Layers so far whose attention ran the recorded call (testbed/engine/attention/layer_call.py)."""
    from testbed.engine.attention import layer_call
    if not getattr(layer_call.LayerCall, "_counted", False):
        real = layer_call.LayerCall.__call__

        def counted(self, *a):
            _replays[0] += 1
            return real(self, *a)
        layer_call.LayerCall.__call__ = counted
        layer_call.LayerCall._counted = True
    return _replays[0]


class layers_through_run:
    """Within: every layer's attention goes through wrapper.run() (nothing recorded)."""

    def __enter__(self):
        from testbed.engine.attention import layer_call
        self.mod, self.real = layer_call, layer_call.record
        layer_call.record = lambda w, q, k, v, out: (w.run(q, (k, v), out=out), None)

    def __exit__(self, *exc):
        self.mod.record = self.real


def main(argv):
    import numpy as np
    import torch

    from testbed import assemble
    from testbed.config import compose
    from testbed.engine.build import make_pieces
    from testbed.engine.executor import EngineExecutor
    from testbed.engine.synthetic_batch import greedy_sampling, synthetic_host_batch

    out, argv = pop_out(argv)
    cfg = compose(["backend=engine", "engine.piecewise_graphs=false"] + argv)
    spec = assemble.model_spec(cfg)
    parts = assemble.engine_parts(cfg)
    dev, slots = parts.device, parts.slots
    torch.cuda.synchronize(dev)
    free0 = torch.cuda.mem_get_info(dev)[0]
    t0 = time.perf_counter()
    s = dataclasses.replace(assemble.engine_settings(cfg, spec), piecewise_graphs=True)
    pieces = make_pieces(s, parts.model, dev, slots // s.page_size, spec.max_context)
    capture_s = time.perf_counter() - t0
    graph_mem = free0 - torch.cuda.mem_get_info(dev)[0]
    rows = cfg.scheduler.max_running * 2
    plain = EngineExecutor(parts.model, dev, rows, None, None, parts.graphs)
    piecewise = EngineExecutor(parts.model, dev, rows, None, None, parts.graphs, pieces)
    res = {"model": cfg.model.name, "capture_s": capture_s, "graph_memory_gib": graph_mem / 2**30,
           "sizes": len(pieces.sizes), "max_tokens": pieces.max_tokens, "graphs": pieces.num_graphs, "shapes": []}
    ok = True
    for k, (ext, cac) in enumerate(SHAPES):
        hb = synthetic_host_batch(ext, cac, slots, cfg.engine.page_size, spec.vocab_size, seed=k)
        fb = hb.fb.to(dev)
        with torch.inference_mode():
            replays = count_replays()
            want = parts.model(fb).float()
            replayed = count_replays() - replays
            with layers_through_run():
                via_run = parts.model(fb).float()
            got = pieces.run(fb).float()
        rel = float((got - want).abs().max() / want.abs().max())
        agree = float((got.argmax(-1) == want.argmax(-1)).float().mean())
        # the recorded attention call replayed on layers 1.. must give run()'s very bits
        exact = bool(torch.equal(want, via_run))
        ok &= rel < 2e-2 and agree >= 0.99 and exact and replayed == spec.num_layers - 1
        samp = greedy_sampling(len(ext))
        row = {"extend": len(ext), "tokens": int(sum(ext)), "kv_tokens": int(sum(ext) + sum(cac)),
               "max_rel_diff": rel, "argmax_agree": agree, "layers_replayed": replayed,
               "replay_equals_run": exact}
        # host launch and device time of each executor, with the attention call replayed and
        # with every layer through run(), alternated in rounds (the machine's speed drifts)
        times: dict[str, tuple[list, list]] = {}
        for _ in range(4):
            for name, ex in (("eager", plain), ("piecewise", piecewise)):
                for mode in ("", "_via_run"):
                    host, devt = times.setdefault(name + mode, ([], []))
                    with layers_through_run() if mode else contextlib.nullcontext():
                        for _ in range(4):
                            a = time.perf_counter()
                            h = ex.launch_host(hb, samp)
                            host.append(time.perf_counter() - a)
                            devt.append(ex.collect(h).duration)
        for key, (host, devt) in times.items():
            row[f"{key}_launch_ms"] = 1e3 * float(np.median(host[4:]))
            row[f"{key}_device_ms"] = 1e3 * float(np.median(devt[4:]))
        res["shapes"].append(row)
        print(json.dumps(row), flush=True)
    res["ok"] = bool(ok)
    print(f"capture {capture_s:.1f} s, {pieces.num_graphs} graphs over {len(pieces.sizes)} sizes, "
          f"{graph_mem / 2**30:.2f} GiB; logits {'agree' if ok else 'DISAGREE'}")
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
