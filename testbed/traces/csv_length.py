"""Length-only CSV traces (sharegpt, arxiv, bwb): prompt and output token counts per row,
no arrival times (synthesized), no prefix information (independent random ids)."""
from __future__ import annotations

from .assemble import Rows, assemble
from .base import TRACES, Source, Trace, find_file
from .config import TraceConfig
from .plain_csv import int_columns
from .token_ids import unique_ids

FILES = {
    "sharegpt": "sharegpt_8k.csv",
    "arxiv": "arxiv_summarization.csv",
    "bwb": "bwb.csv",
}
PROMPT, OUTPUT = "num_prefill_tokens", "num_decode_tokens"


def load(k: TraceConfig) -> Trace:
    path = find_file(k.path, FILES[k.name], k.name)
    src = Source(str(path), "csv")
    lengths = int_columns(path, (PROMPT, OUTPUT), minimum=1)  # the bundled files: no pandas
    if lengths is None:  # any other file (quoted cells, blank lines, a bad value): pandas reads it and words its errors
        from .columns import int_column, read_csv, require
        df, src = read_csv(path)
        require(df, src, [PROMPT, OUTPUT])
        lengths = [int_column(df, src, PROMPT, minimum=1)[0], int_column(df, src, OUTPUT, minimum=1)[0]]
    prompt, output = lengths
    notes = [f"token ids: seeded random (seed {k.seed}, vocab {k.vocab_size}), independent per request"]
    if k.name == "sharegpt":
        notes.append("sharegpt rows are consecutive turns with cumulative context; "
                     "ids do not model that prefix reuse")
    rows = Rows(
        src=src,
        prompt_len=prompt,
        output_len=output,
        make_ids=lambda take, rids, lens: unique_ids(k.seed, rids, lens, k.vocab_size),
        lazy_ids=True,
        shufflable=True,
        notes=notes,
    )
    return assemble(k.name, rows, k)


for _name in FILES:
    TRACES.register(_name, load)
