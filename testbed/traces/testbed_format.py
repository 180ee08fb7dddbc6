"""The testbed's own trace-file format (trace=file, trace.format=testbed): a CSV, JSONL or
Parquet table, one request a row.

Columns: output_tokens (required); prompt_ids (a list of ints, used exactly) or
prompt_tokens (a length), per row; optional arrival_s (seconds, or Parquet timestamps /
durations; synthesized when absent; shifted so the first arrival is at 0), prefix_ids (list
of block ids, like Mooncake hash_ids, block_size tokens each; with prompt_tokens only),
priority (int). In CSV a list is a JSON list string "[1, 2]" or
space-separated ints "1 2".
"""
from __future__ import annotations

import numpy as np

from .assemble import Rows
from .base import Source, TraceError
from .columns import ignored_columns, int_column, int_list, require, seconds_column
from .config import TraceConfig
from .token_ids import block_ids, unique_ids

PROMPT_IDS, PROMPT_TOKENS, OUTPUT = "prompt_ids", "prompt_tokens", "output_tokens"
ARRIVAL, PREFIX, PRIORITY = "arrival_s", "prefix_ids", "priority"
COLUMNS = (PROMPT_IDS, PROMPT_TOKENS, OUTPUT, ARRIVAL, PREFIX, PRIORITY)


def _lists(df, src, name) -> list[np.ndarray | None]:
    if name not in df.columns:
        return [None] * len(df)
    return [int_list(v, src, i, name) for i, v in enumerate(df[name].to_numpy())]


def rows(df, src: Source, k: TraceConfig) -> Rows:
    """The checked rows of a table in this format."""
    if PROMPT_IDS not in df.columns and PROMPT_TOKENS not in df.columns:
        present = ", ".join(map(str, df.columns)) or "none"
        raise TraceError(f"{src.path}: missing column '{PROMPT_TOKENS}' (or '{PROMPT_IDS}') "
                         f"(columns present: {present})")
    require(df, src, [OUTPUT])
    n = len(df)
    output, _ = int_column(df, src, OUTPUT, minimum=1)

    given = _lists(df, src, PROMPT_IDS)
    has_ids = np.array([g is not None for g in given], dtype=bool)
    if PROMPT_TOKENS in df.columns:
        tokens, has_tokens = int_column(df, src, PROMPT_TOKENS, minimum=1, optional_rows=has_ids)
    else:
        tokens, has_tokens = np.zeros(n, np.int64), np.zeros(n, bool)
    missing = ~has_ids & ~has_tokens
    if missing.any():
        i = int(np.argmax(missing))
        col = PROMPT_TOKENS if PROMPT_TOKENS in df.columns else PROMPT_IDS
        raise src.error(i, col, f"is empty; each row needs {PROMPT_TOKENS} or {PROMPT_IDS}")
    prompt = tokens.copy()
    for i in np.flatnonzero(has_ids):
        ids = given[i]
        if len(ids) == 0:
            raise src.error(int(i), PROMPT_IDS, "is an empty list (prompt length 0)")
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= k.vocab_size:
            raise src.error(int(i), PROMPT_IDS, f"holds id {lo if lo < 0 else hi} outside "
                                                f"[0, vocab_size={k.vocab_size})")
        if has_tokens[i] and tokens[i] != len(ids):
            raise src.error(int(i), PROMPT_TOKENS, f"value {tokens[i]} disagrees with the "
                                                   f"{len(ids)} ids in {PROMPT_IDS}")
        prompt[i] = len(ids)

    prefixes = _lists(df, src, PREFIX)
    for i in np.flatnonzero(has_ids):
        if prefixes[i] is not None:
            raise src.error(int(i), PREFIX, f"is given together with {PROMPT_IDS}; give one of them")
    has_prefix = np.array([p is not None for p in prefixes], dtype=bool)

    arrival = seconds_column(df, src, ARRIVAL) if ARRIVAL in df.columns else None
    priority = int_column(df, src, PRIORITY)[0] if PRIORITY in df.columns else None

    notes = ignored_columns(df, COLUMNS)
    if has_ids.any():
        notes.append(f"token ids: {int(has_ids.sum())} rows give {PROMPT_IDS}, used exactly")
    if has_prefix.any():
        notes.append(f"token ids: {int(has_prefix.sum())} rows give {PREFIX}: each block id expands to the "
                     f"same {k.block_size} ids (seed {k.seed}), cut to {PROMPT_TOKENS}")
    if (~has_ids & ~has_prefix).any():
        notes.append(f"token ids: seeded random (seed {k.seed}, vocab {k.vocab_size}) for rows with "
                     f"only {PROMPT_TOKENS}")

    def make_ids(take, rids, lens):
        out: list = [None] * len(take)
        by_prefix = [j for j, i in enumerate(take) if has_prefix[i]]
        by_random = [j for j, i in enumerate(take) if not has_prefix[i] and not has_ids[i]]
        for j, i in enumerate(take):
            if has_ids[i]:
                out[j] = given[i][: lens[j]].astype(np.int32)
        if by_prefix:
            sel = np.array(by_prefix)
            ids, padded = block_ids(k.seed, [prefixes[take[j]] for j in by_prefix],
                                            rids[sel], lens[sel], k.block_size, k.vocab_size)
            for j, x in zip(by_prefix, ids):
                out[j] = x
            if padded:
                notes.append(f"{padded} rows are longer than their {PREFIX} blocks: padded with ids of their own")
        if by_random:
            sel = np.array(by_random)
            for j, x in zip(by_random, unique_ids(k.seed, rids[sel], lens[sel], k.vocab_size)):
                out[j] = x
        return out

    return Rows(
        src=src,
        prompt_len=prompt,
        output_len=output,
        arrival_s=arrival,
        arrival_what=f"column {ARRIVAL}",
        priority=priority,
        make_ids=make_ids,
        notes=notes,
    )
