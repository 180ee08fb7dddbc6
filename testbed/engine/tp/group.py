"""A rank's place in the tensor-parallel group: the collectives every rank joins alike."""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

TIMEOUT = timedelta(seconds=600)


@dataclass
class TPGroup:
    rank: int
    world: int
    group: object  # the model's collectives (NCCL on GPUs, gloo on the CPU)
    msg_group: object  # gloo: rank 0's step messages (Python objects)


def init_group(rank: int, world: int, port: int, cuda: bool) -> TPGroup:
    """The model's collective group and a gloo group for rank 0's step messages."""
    import torch.distributed as dist
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=TIMEOUT)
    msg_group = dist.new_group(backend="gloo", timeout=TIMEOUT) if cuda else dist.group.WORLD
    return TPGroup(rank, world, dist.group.WORLD, msg_group)


def agree_kv_slots(slots: int, tp: TPGroup) -> int:
    """The KV pool every rank can hold: the smallest."""
    import torch.distributed as dist
    got = [None] * tp.world
    dist.all_gather_object(got, slots, group=tp.msg_group)
    return min(got)


def share_cpu(world: int, threads: int | None = None) -> None:
    """A CPU rank's torch threads: `threads` (engine.cpu_threads), or the cores split over the
    ranks (oversubscribed intra-op threads stall every collective)."""
    import torch
    torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) // world))
