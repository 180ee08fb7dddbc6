"""Where an eager (prefill / mixed) step's host launch time goes: cProfile and torch.profiler
over launches of one mixed shape on the real engine.

    python benchmarks/diag_eager.py model=qwen3_0_6b model.weights=dummy
"""
from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv):
    import torch

    from testbed import assemble
    from testbed.config import compose
    from testbed.engine.build import create_pool, engine_device, kv_slots, load_shard, make_graphs, make_pieces
    from testbed.engine.executor import EngineExecutor
    from testbed.engine.synthetic_batch import greedy_sampling, synthetic_host_batch
    from testbed.engine.warmup import warm_up

    cfg = compose(["backend=engine"] + argv)
    spec = assemble.model_spec(cfg)
    s = assemble.engine_settings(cfg, spec)
    dev = engine_device(s)
    model, _ = load_shard(s, spec, dev)
    slots = kv_slots(s, model, dev)
    create_pool(model, slots, 1)
    graphs = make_graphs(s, model, dev, slots, spec.max_context)
    ex = EngineExecutor(model, dev, 256, None, None, graphs, make_pieces(s, model, dev, slots, spec.max_context))
    warm_up(ex, slots, 1, spec.vocab_size, 8192, 256)
    hb = synthetic_host_batch([450] + [1] * 80, [0] + [2500] * 80, slots, 1, spec.vocab_size)
    samp = greedy_sampling(81)
    for _ in range(5):
        ex.collect(ex.launch_host(hb, samp))
    ts = []
    for _ in range(20):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        h = ex.launch_host(hb, samp)
        ts.append(time.perf_counter() - t0)
        ex.collect(h)
    print("launch_host ms:", [round(t * 1e3, 2) for t in ts])
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(10):
        ex.collect(ex.launch_host(hb, samp))
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
    print(s.getvalue()[:9000])
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            ex.collect(ex.launch_host(hb, samp))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main(sys.argv[1:])
