"""The steps every loader shares once it has checked its rows: order (by time, or
shuffled), take num_requests, arrivals, the over-context rule, token ids, records."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .arrivals import describe_arrivals, synthesize_arrivals
from .base import Source, Trace, TraceRequestList
from .config import TraceConfig
from .lazy_ids import IdWindows
from .streams import SHUFFLE

# ids(rows, rids, lens) -> one int32 array per row taken, of length lens[i] (the prompt
# after the over-context rule; always <= the row's prompt length, a prefix of the full one).
IdMaker = Callable[[np.ndarray, np.ndarray, np.ndarray], list[np.ndarray]]


@dataclass
class Rows:
    """Checked rows of a trace, in file order (0-based row i is src.row(i))."""

    src: Source
    prompt_len: np.ndarray  # int64, >= 1
    output_len: np.ndarray  # int64, >= 1
    make_ids: IdMaker
    arrival_s: np.ndarray | None = None  # float64 trace times (s, before time_scale); None: synthesize
    arrival_what: str = ""  # how arrival_s was made, for the notes
    priority: np.ndarray | None = None  # int64
    shufflable: bool = False  # length-only rows: cfg.shuffle applies
    # make_ids is a pure function of its arguments that adds no notes: the trace makes the ids
    # when they are first read (lazy_ids.py), not up front
    lazy_ids: bool = False
    notes: list[str] = field(default_factory=list)


def _order(rows: Rows, k: TraceConfig, notes: list[str]) -> np.ndarray:
    n = len(rows.prompt_len)
    if rows.arrival_s is not None:
        t = rows.arrival_s
        if np.all(t[1:] >= t[:-1]):
            return np.arange(n)
        order = np.argsort(t, kind="stable")
        notes.append("rows were not in time order: sorted by arrival (stable), rids renumbered in arrival order")
        return order
    if rows.shufflable and k.shuffle:
        notes.append(f"rows shuffled (seed {k.seed}) before taking num_requests")
        return np.random.default_rng([k.seed, SHUFFLE]).permutation(n)
    if rows.shufflable:
        notes.append("rows kept in file order (shuffle=false)")
    elif rows.src.kind != "synthetic":
        notes.append("rows kept in file order (no arrival times; shuffle applies only to sharegpt, arxiv, bwb and ShareGPT JSON files)")
    return np.arange(n)


def _over_context(prompt: np.ndarray, output: np.ndarray, k: TraceConfig, notes: list[str]):
    """Apply the rule; returns (prompt, output, info dict)."""
    info = {"rule": k.over_context, "count": 0, "rids": [], "max_context": k.max_context}
    if k.max_context is None:
        notes.append("max_context not set: prompt + output lengths are not checked against a context")
        return prompt, output, info
    over = prompt + output > k.max_context
    rids = np.flatnonzero(over)
    info["count"] = int(len(rids))
    info["rids"] = [int(r) for r in rids]
    n = len(prompt)
    if k.over_context == "reject":
        notes.append(f"over_context: {len(rids)} of {n} requests have prompt + output > max_context "
                     f"{k.max_context}; rule reject: kept in the list, listed in over_context['rids'], "
                     f"the scheduler rejects them")
        return prompt, output, info
    new_out = np.minimum(output, k.max_context - 1)
    new_prompt = np.minimum(prompt, k.max_context - new_out)
    outs_cut = int(np.count_nonzero(new_out < output))
    notes.append(f"over_context: {len(rids)} of {n} requests have prompt + output > max_context "
                 f"{k.max_context}; rule truncate: prompts cut to their first tokens so prompt + output "
                 f"fit ({outs_cut} of them had output >= max_context: output cut to max_context - 1, "
                 f"prompt to 1 token)")
    return new_prompt, new_out, info


def assemble(name: str, rows: Rows, k: TraceConfig) -> Trace:
    notes = [f"source: {rows.src.path} ({len(rows.prompt_len)} rows)"] + list(rows.notes)
    known = len(rows.notes)
    order = _order(rows, k, notes)
    total = len(order)
    if k.num_requests is None:
        take = order
    else:
        if k.num_requests > total:
            notes.append(f"num_requests={k.num_requests} but the trace has {total} rows: using all {total}")
        take = order[: k.num_requests]
    n = len(take)
    if n < total:
        notes.append(f"trace.num_requests={k.num_requests}: {n} of {total} rows used, {total - n} left out")
    rids = np.arange(n, dtype=np.int64)

    if rows.arrival_s is not None:
        t = rows.arrival_s[take]
        start = float(rows.arrival_s.min())
        if start != 0:  # a Unix timestamp or a negative offset: the run starts at the first arrival
            notes.append(f"earliest arrival is {start:.9g} s: all arrivals shifted by {-start:+.9g} s to start at 0")
            t = t - start
        arrivals = t * k.time_scale
        notes.append(f"arrivals from the trace: {rows.arrival_what}, times time_scale {k.time_scale:g}")
    else:
        arrivals = synthesize_arrivals(n, k.rate, k.burstiness, k.seed)
        notes.append(describe_arrivals(k.rate, k.burstiness, k.seed))

    prompt, output, info = _over_context(rows.prompt_len[take], rows.output_len[take], k, notes)
    # ids only for requests that can run: a rejected prompt of 1e9 tokens would take 4 GB
    runs = np.ones(n, bool)
    if info["rule"] == "reject":
        runs[info["rids"]] = False
    source = IdWindows(name, rows.make_ids, take, rids, prompt, runs, None if rows.lazy_ids else np.inf)
    priority = rows.priority[take] if rows.priority is not None else np.zeros(n, dtype=np.int64)
    requests = TraceRequestList(np.asarray(arrivals, float), prompt, output, priority, runs, source)
    if not rows.lazy_ids:  # made now, in one call: the notes say what the maker found
        for r in requests:
            r.make_ids()
        notes.extend(rows.notes[known:])
    return Trace(name=name, requests=requests, over_context=info, notes=notes, rows=total,
                 synthesized_arrivals=rows.arrival_s is None)
