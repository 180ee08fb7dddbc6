"""A synthetic trace: uniform prompt and output lengths, seeded arrivals, and optionally
groups of requests that share a prefix of prefix_len tokens."""
from __future__ import annotations

import numpy as np

from .assemble import Rows, assemble
from .base import TRACES, Source, Trace, TraceError
from .config import TraceConfig, bad_value
from .streams import GROUP_IDS, GROUPS, LENGTHS, UNIQUE_IDS
from .token_ids import keyed_runs, keyed_table


def check(k: TraceConfig) -> None:
    """The synthetic knobs (the others are checked for every trace, config.resolve_config)."""
    for key in ("prompt_len_min", "output_len_min"):
        if getattr(k, key) < 1:
            raise bad_value(key, getattr(k, key), "use an int >= 1")
    for lo, hi in (("prompt_len_min", "prompt_len_max"), ("output_len_min", "output_len_max")):
        if getattr(k, hi) < getattr(k, lo):
            raise bad_value(hi, getattr(k, hi), f"use an int >= {lo} ({getattr(k, lo)})")
    for key in ("num_prefix_groups", "prefix_len"):
        if getattr(k, key) < 0:
            raise bad_value(key, getattr(k, key), "use an int >= 0")
    if k.num_prefix_groups > 0 and k.prefix_len > k.prompt_len_min:
        raise bad_value("prefix_len", k.prefix_len, f"the shared prefix is part of the prompt, so use at most "
                        f"prompt_len_min ({k.prompt_len_min})")
    if k.num_requests is None:
        raise TraceError("trace config: num_requests is 0 or null (every row); the synthetic trace needs an int >= 1")


def load(k: TraceConfig) -> Trace:
    check(k)
    n = int(k.num_requests)
    rng = np.random.default_rng([k.seed, LENGTHS])
    prompt = rng.integers(k.prompt_len_min, k.prompt_len_max + 1, size=n, dtype=np.int64)
    output = rng.integers(k.output_len_min, k.output_len_max + 1, size=n, dtype=np.int64)
    groups_n = k.num_prefix_groups
    sharing = groups_n > 0 and k.prefix_len > 0
    notes = [f"lengths: prompt uniform in [{k.prompt_len_min}, {k.prompt_len_max}], output uniform "
             f"in [{k.output_len_min}, {k.output_len_max}] (seed {k.seed})"]
    if sharing:
        group = np.random.default_rng([k.seed, GROUPS]).integers(0, groups_n, size=n)
        notes.append(f"prefix sharing: each request picks one of {groups_n} groups (uniform, seed "
                     f"{k.seed}); its first {k.prefix_len} prompt tokens are the group's shared ids")
    else:
        group = None
        notes.append(f"no prefix sharing (num_prefix_groups={groups_n}, prefix_len={k.prefix_len})"
                     if groups_n > 0 else "no prefix sharing (num_prefix_groups=0)")
    notes.append(f"token ids: seeded random (seed {k.seed}, vocab {k.vocab_size})")

    def make_ids(take, rids, lens):
        if group is None:
            return keyed_runs(k.seed, UNIQUE_IDS, rids, np.zeros(len(take), np.int64), lens, k.vocab_size)
        shared = keyed_table(k.seed, GROUP_IDS, np.arange(groups_n), k.prefix_len, k.vocab_size)
        head = np.minimum(lens, k.prefix_len)  # a truncated prompt may keep only part of it
        tails = keyed_runs(k.seed, UNIQUE_IDS, rids, head, lens - head, k.vocab_size)
        g = group[take]
        return [np.concatenate([shared[gi, :h], tail]) for gi, h, tail in zip(g, head, tails)]

    rows = Rows(
        src=Source("synthetic trace", "synthetic"),
        prompt_len=prompt,
        output_len=output,
        make_ids=make_ids,
        lazy_ids=True,
        notes=notes,
    )
    return assemble("synthetic", rows, k)


TRACES.register("synthetic", load)
