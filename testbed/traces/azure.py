"""Azure LLM inference traces 2023 (conversation, code): wall-clock TIMESTAMP with 7-digit
fractional seconds, ContextTokens, GeneratedTokens. No prefix information."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .assemble import Rows, assemble
from .base import TRACES, Trace, find_file
from .columns import int_column, read_csv, require
from .config import TraceConfig
from .token_ids import unique_ids

FILES = {
    "azure_conv": "azure_conv_2023.csv",
    "azure_code": "azure_code_2023.csv",
}
TIME, PROMPT, OUTPUT = "TIMESTAMP", "ContextTokens", "GeneratedTokens"


def parse_times(col: pd.Series, src) -> np.ndarray:
    """Seconds since the earliest timestamp, exact to the 100 ns of the 7-digit fraction."""
    try:
        ts = pd.to_datetime(col.astype(str).str.strip(), format="ISO8601", errors="coerce")
    except (ValueError, TypeError) as e:  # e.g. time zones mixed with naive times
        raise src.error(None, TIME, f"timestamps cannot be parsed together ({' '.join(str(e).split())})") from None
    if getattr(ts.dt, "tz", None) is not None:
        ts = ts.dt.tz_convert(None)
    bad = ts.isna().to_numpy() | col.isna().to_numpy()
    if bad.any():
        i = int(np.argmax(bad))
        raise src.error(i, TIME, f"value {col.iloc[i]!r} is not a timestamp like 2023-11-16 18:17:03.9799600")
    ns = ts.astype("datetime64[ns]").to_numpy().astype(np.int64)
    return (ns - ns.min()) / 1e9


def load(k: TraceConfig) -> Trace:
    path = find_file(k.path, FILES[k.name], k.name)
    df, src = read_csv(path)
    require(df, src, [TIME, PROMPT, OUTPUT])
    prompt, _ = int_column(df, src, PROMPT, minimum=1)
    output, _ = int_column(df, src, OUTPUT, minimum=1)
    rows = Rows(
        src=src,
        prompt_len=prompt,
        output_len=output,
        arrival_s=parse_times(df[TIME], src),
        arrival_what=f"{TIME} minus the earliest {TIME}, in seconds",
        make_ids=lambda take, rids, lens: unique_ids(k.seed, rids, lens, k.vocab_size),
        lazy_ids=True,
        notes=[f"token ids: seeded random (seed {k.seed}, vocab {k.vocab_size}), independent per request"],
    )
    return assemble(k.name, rows, k)


for _name in FILES:
    TRACES.register(_name, load)
