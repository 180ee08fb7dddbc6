"""BurstGPT CSV (Wang et al., 2024; GPT-3.5 / GPT-4 requests served on Azure) as a user's
file: Timestamp (seconds), Model, Request tokens, Response tokens, Total tokens, Log Type.
The trace has no text and no prefix information: ids are each request's own. Rows with
Response tokens 0 are requests that failed in the trace; they are left out, and counted."""
from __future__ import annotations

from collections import Counter

import numpy as np

from .assemble import Rows
from .base import Source, TraceError
from .columns import float_column, ignored_columns, int_column, require
from .config import TraceConfig
from .token_ids import unique_ids

TIME, MODEL, PROMPT, OUTPUT, TOTAL, LOG = (
    "Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")
COLUMNS = (TIME, MODEL, PROMPT, OUTPUT, TOTAL, LOG)


def _mix(df, name: str, keep: np.ndarray) -> str | None:
    """'ChatGPT 9, GPT-4 3' for a label column of the rows kept."""
    if name not in df.columns:
        return None
    counts = Counter(str(v) for v in df[name].to_numpy()[keep])
    return ", ".join(f"{v} {n}" for v, n in counts.most_common())


def rows(df, src: Source, k: TraceConfig) -> Rows:
    require(df, src, [TIME, PROMPT, OUTPUT])
    times = float_column(df, src, TIME)
    prompt, _ = int_column(df, src, PROMPT, minimum=0)
    output, _ = int_column(df, src, OUTPUT, minimum=0)
    keep = output > 0
    if not keep.any():
        raise TraceError(f"{src.path}: every row has {OUTPUT} 0 (requests that failed in the trace): nothing to replay")
    empty = keep & (prompt < 1)
    if empty.any():
        i = int(np.argmax(empty))
        raise src.error(i, PROMPT, f"value {prompt[i]} is below the minimum 1 (a request with a response needs a prompt)")
    index = np.flatnonzero(keep)
    notes = ignored_columns(df, COLUMNS)
    if len(index) < len(df):
        notes.append(f"{len(df) - len(index)} of {len(df)} rows have {OUTPUT} 0 (requests that failed in the "
                     f"trace): left out")
    for name, what in ((MODEL, " (all replayed on this run's model)"), (LOG, "")):
        mix = _mix(df, name, keep)
        if mix:
            notes.append(f"{name}: {mix}{what}")
    notes.append(f"token ids: seeded random (seed {k.seed}, vocab {k.vocab_size}), independent per request")
    return Rows(
        src=src.subset(index),
        prompt_len=prompt[index],
        output_len=output[index],
        arrival_s=times[index],
        arrival_what=f"{TIME} (s)",
        make_ids=lambda take, rids, lens: unique_ids(k.seed, rids, lens, k.vocab_size),
        lazy_ids=True,
        notes=notes,
    )
