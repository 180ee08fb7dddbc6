"""A tensor-parallel rank other than 0: build the model shard of rank 0's ModelSpec from
rank 0's engine settings, then run what rank 0 sends."""
from __future__ import annotations

import os
import signal


def worker_main(rank: int, world: int, port: int, settings, spec) -> None:
    # Ctrl-C reaches the whole process group; rank 0 decides when ranks stop
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    import torch
    import torch.distributed as dist

    from testbed.engine.build import build_parts, engine_device
    from testbed.engine.executor import EngineExecutor
    from testbed.engine.tp.group import init_group, share_cpu
    from testbed.engine.tp.messages import check_same_plan

    device = engine_device(settings, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        share_cpu(world, settings.cpu_threads)
    tp = init_group(rank, world, port, device.type == "cuda")
    parts = build_parts(settings, spec, tp)
    ex = EngineExecutor(parts.model, parts.device, settings.max_running, graphs=parts.graphs, pieces=parts.pieces)
    prev = None
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0, group=tp.msg_group)
        if box[0] is None:
            break
        hb, sampling = box[0]
        if settings.debug_plan_hash:
            check_same_plan(hb, tp.msg_group, rank)
        handle = ex.launch_host(hb, sampling)
        if prev is not None:
            ex.collect(prev)
        prev = handle
    if prev is not None:
        ex.collect(prev)
    dist.destroy_process_group()
