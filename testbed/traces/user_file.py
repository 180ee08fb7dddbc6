"""A user's own trace file (trace=file, trace.path=...): which format it is in, and its reader.

trace.format names the format, or `auto` reads it from the content: a JSON array is
`vllm bench`'s ShareGPT conversations (sharegpt_json.py); a table (CSV, JSONL, Parquet)
with `Request tokens` and `Response tokens` is BurstGPT (burstgpt.py), one with
`input_length` is Mooncake / AIPerf (mooncake.py), anything else the testbed's own columns
(testbed_format.py).
"""
from __future__ import annotations

from . import burstgpt, mooncake, sharegpt_json, testbed_format
from .assemble import assemble
from .base import TRACES, Trace, TraceError, find_file
from .columns import read_table
from .config import TraceConfig

TABLE_READERS = {
    "testbed": testbed_format.rows,
    "mooncake": lambda df, src, k: mooncake.rows(df, src, k, k.block_size),
    "burstgpt": burstgpt.rows,
}


def detect(columns) -> tuple[str, str]:
    """(format, why) of a table from its column names."""
    cols = set(map(str, columns))
    if {burstgpt.PROMPT, burstgpt.OUTPUT} <= cols:
        return "burstgpt", f"columns '{burstgpt.PROMPT}' and '{burstgpt.OUTPUT}'"
    if mooncake.PROMPT in cols:
        return "mooncake", f"column '{mooncake.PROMPT}'"
    return "testbed", "no BurstGPT or Mooncake columns"


def load(k: TraceConfig) -> Trace:
    path = find_file(k.path, None, "trace name 'file'")
    if k.format == "sharegpt" or (k.format == "auto" and sharegpt_json.starts_as_array(path)):
        why = "given" if k.format == "sharegpt" else "a JSON array"
        rows = sharegpt_json.rows(path, k)
        fmt = "sharegpt"
    else:
        if sharegpt_json.starts_as_array(path):  # format= names a table format
            raise TraceError(f"{path}: a JSON array is read as trace.format=sharegpt, not {k.format}")
        df, src = read_table(path)
        fmt, why = (k.format, "given") if k.format != "auto" else detect(df.columns)
        rows = TABLE_READERS[fmt](df, src, k)
    rows.notes.insert(0, f"format: {fmt} ({why})")
    return assemble("file", rows, k)


TRACES.register("file", load)
