"""Every step's batch of a recorded run, rebuilt from its two Parquet files, and the
per-step device error of a cost model on them.

A step's row in steps.parquet has only totals; its batch (each request's new and cached
tokens) is what a cost model needs. requests.parquet has it implicitly: a prefill chunk's
time is its step's start_s, an output token's time is the end_s of the step that made it
(both drivers record them so). A request's k-th output token (k >= 1) is a decode of one
token over prompt + k - 1 cached ones; its chunks extend over its cached prefix and the
chunks before them. Requests that were preempted recompute over a prefix the files do not
record: steps holding one are left out (None). The rebuild is checked against each step's
recorded totals."""
from __future__ import annotations

import numpy as np
import pandas as pd

from testbed.timeline.idle import idle_before


def is_mixed(extend) -> bool:
    """A step's extend lengths hold a chunk beside decodes."""
    e = np.asarray(extend)
    return bool((e == 1).any() and (e > 1).any())


def _time_index(times: np.ndarray) -> tuple[dict, np.ndarray]:
    """time -> the step it belongs to, and which steps share theirs with another: a cost model
    without host time starts two steps at one instant (the roofline: the next is scheduled
    while the first runs), and the files do not say which of them a chunk went to (-1)."""
    index: dict = {}
    for i, t in enumerate(times):
        index[t] = -1 if t in index else i
    return index, np.array([index[t] == -1 for t in times], bool)


def step_batches(requests: pd.DataFrame, steps: pd.DataFrame) -> list[tuple[np.ndarray, np.ndarray] | None]:
    """Per step row: (extend lengths, cached lengths), or None where a preempted request ran or
    the step shares its start (or end) time with another, so its items are not known."""
    by_start, shared_start = _time_index(steps["start_s"].to_numpy())
    by_end, shared_end = _time_index(steps["end_s"].to_numpy())
    ext: list[list[int]] = [[] for _ in range(len(steps))]
    cac: list[list[int]] = [[] for _ in range(len(steps))]
    unknown = shared_start | shared_end

    def at(index: dict, t: float, rid) -> int:
        i = index.get(t)
        if i is None:
            raise ValueError(f"request {rid}: time {t!r} is no step's start or end in steps.parquet")
        return i

    for r in requests.itertuples(index=False):
        if r.state != "FINISHED":
            continue
        chunks = [at(by_start, t, r.rid) for t in r.chunk_times_s]
        tokens = [at(by_end, t, r.rid) for t in r.token_times_s[1:]]
        if r.preemptions:
            unknown[[i for i in chunks + tokens if i >= 0]] = True
            continue
        c = int(r.prefix_cached_tokens)
        for i, n in zip(chunks, r.chunk_tokens):
            if i >= 0:  # -1: one of the steps sharing its time (unknown)
                ext[i].append(int(n))
                cac[i].append(c)
            c += int(n)
        for k, i in enumerate(tokens, start=1):
            if i >= 0:
                ext[i].append(1)
                cac[i].append(int(r.prompt_tokens) + k - 1)
    out: list[tuple[np.ndarray, np.ndarray] | None] = []
    for i, (e, c) in enumerate(zip(ext, cac)):
        if unknown[i]:
            out.append(None)
            continue
        e, c = np.array(e, np.int64), np.array(c, np.int64)
        row = steps.iloc[i]
        if (len(e) != row["batch_reqs"] or e.sum() != row["prefill_tokens"] + row["decode_tokens"]
                or (e + c).sum() != row["context_tokens"]):
            raise ValueError(f"step {row['step']}: the requests' records give {len(e)} requests, {e.sum()} tokens "
                             f"and {(e + c).sum()} KV tokens; steps.parquet says {row['batch_reqs']}, "
                             f"{row['prefill_tokens'] + row['decode_tokens']} and {row['context_tokens']}")
        out.append((e, c))
    return out


def decoded_tokens(requests: pd.DataFrame, steps: pd.DataFrame) -> np.ndarray:
    """Per step row: the KV tokens its decode rows generated themselves, the one each writes
    this step included (the step that makes a request's token k + 1 holds k of them). The
    allocator gives a decoding request one page a step, so these lie interleaved with the other
    rows' while its prompt is one run of slots. Counted over the finished requests, as
    step_batches rebuilds the steps (where it gives None the count is not the step's)."""
    by_end, _ = _time_index(steps["end_s"].to_numpy())
    out = np.zeros(len(steps), np.int64)
    for r in requests.itertuples(index=False):
        if r.state != "FINISHED":
            continue
        for k, t in enumerate(r.token_times_s[1:], start=1):
            i = by_end.get(t, -1)
            if i >= 0:
                out[i] += k
    return out


def woken(steps: pd.DataFrame, cost) -> np.ndarray:
    """Per step: launched after the host sat idle longer than the cost model's wake gap (its
    device time holds the wake)."""
    gap = cost.wake[0] if cost.wake else np.inf
    return idle_before(steps["start_s"], steps["end_s"], steps["complete_s"]) > gap


def step_device_errors(requests: pd.DataFrame, steps: pd.DataFrame, cost) -> pd.DataFrame:
    """A row per rebuilt step: kind (decode_graph, decode_eager, prefill, mixed), requests,
    measured device seconds (duration_s), the device time the simulator would charge it (the
    cost model's device_time, plus the wake's device seconds for a step launched after the
    host sat idle longer than the wake's gap) and whether it was so woken."""
    extra = cost.wake[3] if cost.wake else 0.0
    woken_at = woken(steps, cost)
    rows = []
    for i, b in enumerate(step_batches(requests, steps)):
        if b is None or not len(b[0]):
            continue
        e, c = b
        kind = "mixed" if is_mixed(e) else "prefill" if not (e == 1).any() else (
            "decode_graph" if cost.is_graph(e) else "decode_eager")
        rows.append((kind, len(e), float(steps["duration_s"].iat[i]),
                     float(cost.device_time(e, c)) + (extra if woken_at[i] else 0.0), bool(woken_at[i])))
    return pd.DataFrame(rows, columns=["kind", "reqs", "measured_s", "predicted_s", "woken"])


BATCH_BINS = (0, 8, 32, 64, 128, 256, 10**9)


def device_error_table(errors: pd.DataFrame) -> pd.DataFrame:
    """Per step kind and batch-size bin: steps, median and time-weighted predicted / measured."""
    if errors.empty:
        return pd.DataFrame(columns=["kind", "requests", "steps", "median_ratio", "time_ratio"])
    labels = [f"{lo + 1}-{hi}" if hi < 10**9 else f">{lo}" for lo, hi in zip(BATCH_BINS, BATCH_BINS[1:])]
    e = errors.assign(bin=pd.cut(errors["reqs"], BATCH_BINS, labels=labels),
                      ratio=errors["predicted_s"] / errors["measured_s"])
    g = e.groupby(["kind", "bin"], observed=True).agg(steps=("ratio", "size"), median_ratio=("ratio", "median"),
                                                       pred=("predicted_s", "sum"), meas=("measured_s", "sum"))
    g["time_ratio"] = g["pred"] / g["meas"]
    g = g.reset_index().rename(columns={"bin": "requests"})
    return g[["kind", "requests", "steps", "median_ratio", "time_ratio"]]
