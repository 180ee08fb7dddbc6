"""A tensor-parallel rank other than 0: build the model shard of rank 0's ModelSpec, then run what rank 0 sends."""
from __future__ import annotations

import os
import signal
from datetime import timedelta

TIMEOUT = timedelta(seconds=600)


def init_group(rank: int, world: int, port: int, cuda: bool):
    """The model's collective group (NCCL on GPUs, gloo on the CPU) and a gloo group for
    rank 0's step messages (Python objects)."""
    import torch.distributed as dist
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=TIMEOUT)
    msg_group = dist.new_group(backend="gloo", timeout=TIMEOUT) if cuda else dist.group.WORLD
    return dist.group.WORLD, msg_group


def agree_kv_slots(slots: int, msg_group) -> int:
    """The KV pool every rank can hold: the smallest."""
    import torch.distributed as dist
    got = [None] * dist.get_world_size(msg_group)
    dist.all_gather_object(got, slots, group=msg_group)
    return min(got)


def share_cpu(world: int) -> None:
    """CPU ranks split the cores: oversubscribed intra-op threads stall every collective."""
    import torch
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))


def worker_main(rank: int, world: int, port: int, cfg, spec) -> None:
    # Ctrl-C reaches the whole process group; rank 0 decides when ranks stop
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    import torch
    import torch.distributed as dist

    from testbed.engine.build import create_pool, engine_device, kv_slots, load_model_for, make_graphs, make_pieces
    from testbed.engine.executor import EngineExecutor
    from testbed.engine.tp.messages import check_same_plan

    device = engine_device(cfg, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        share_cpu(world)
    group, msg_group = init_group(rank, world, port, device.type == "cuda")
    model, _ = load_model_for(cfg, spec, device, rank, world, group)
    slots = agree_kv_slots(kv_slots(cfg, model, device), msg_group)
    create_pool(model, slots, cfg.engine.page_size)
    graphs = make_graphs(cfg, model, device, slots // cfg.engine.page_size, spec.max_context)
    pieces = make_pieces(cfg, model, device, slots // cfg.engine.page_size)
    ex = EngineExecutor(model, device, cfg.policy.max_running, graphs=graphs, pieces=pieces)
    prev = None
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0, group=msg_group)
        if box[0] is None:
            break
        hb, sampling = box[0]
        if cfg.engine.debug_plan_hash:
            check_same_plan(hb, msg_group, rank)
        handle = ex.launch_host(hb, sampling)
        if prev is not None:
            ex.collect(prev)
        prev = handle
    if prev is not None:
        ex.collect(prev)
    dist.destroy_process_group()
