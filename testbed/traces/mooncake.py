"""Mooncake (Kimi) traces, and the same JSONL as a user's file (AIPerf's mooncake_trace):
timestamp (ms), input_length, output_length and hash_ids (one id per prefix block of
block_size tokens; equal ids at equal positions are shared KV)."""
from __future__ import annotations

from .assemble import Rows, assemble
from .base import TRACES, Source, Trace, find_file
from .columns import float_column, ignored_columns, int_column, int_list, read_jsonl, require
from .config import TraceConfig
from .token_ids import block_ids, unique_ids

FILES = {
    "mooncake_conversation": "mooncake_conversation.jsonl",
    "mooncake_synthetic": "mooncake_synthetic.jsonl",
}
BLOCK = 512  # tokens per hash_id block of the bundled traces, fixed by them
TIME, PROMPT, OUTPUT, HASHES = "timestamp", "input_length", "output_length", "hash_ids"


def rows(df, src: Source, k: TraceConfig, block: int) -> Rows:
    """The checked rows of a Mooncake table: input_length and output_length in every row;
    timestamp (ms) and hash_ids where the table has those columns (AIPerf reads files
    without them: arrivals are then synthesized, and ids are a request's own)."""
    require(df, src, [PROMPT, OUTPUT])
    prompt, _ = int_column(df, src, PROMPT, minimum=1)
    output, _ = int_column(df, src, OUTPUT, minimum=1)
    times_ms = float_column(df, src, TIME) if TIME in df.columns else None
    notes = ignored_columns(df, (TIME, PROMPT, OUTPUT, HASHES))
    if HASHES in df.columns:
        notes.append(f"token ids: each hash_id expands to the same {block} ids (seed {k.seed}, vocab "
                     f"{k.vocab_size}), concatenated and cut to input_length (last block partial)")
        make_ids = _block_ids(df[HASHES].to_numpy(), prompt, src, k, block, notes)
    else:
        notes.append(f"token ids: no {HASHES} column: seeded random (seed {k.seed}), independent per request")
        make_ids = lambda take, rids, lens: unique_ids(k.seed, rids, lens, k.vocab_size)  # noqa: E731
    return Rows(src=src, prompt_len=prompt, output_len=output,
                arrival_s=None if times_ms is None else times_ms / 1000.0, arrival_what=f"{TIME} ms / 1000",
                make_ids=make_ids, notes=notes)


def _block_ids(hashes, prompt, src: Source, k: TraceConfig, block: int, notes: list[str]):
    """The id maker of rows with hash_ids: each block id expands to the same block ids."""
    def make_ids(take, rids, lens):
        blocks = []
        for i in take:  # hash_ids are checked only for the rows taken
            b = int_list(hashes[i], src, int(i), HASHES)
            if b is None:
                raise src.error(int(i), HASHES, "is missing (need a list, possibly empty)")
            blocks.append(b)
        ids, padded = block_ids(k.seed, blocks, rids, lens, block, k.vocab_size)
        full = -(-prompt[take] // block)  # blocks the untruncated input_length covers
        unused = int(sum(len(b) > f for b, f in zip(blocks, full)))
        if padded:
            notes.append(f"{padded} requests are longer than their hash_ids blocks: padded with ids of their own")
        if unused:
            notes.append(f"{unused} requests have more hash_ids blocks than input_length covers: "
                         f"the extra blocks are unused")
        return ids
    return make_ids


def load(k: TraceConfig) -> Trace:
    path = find_file(k.path, FILES[k.name], k.name)
    df, src = read_jsonl(path)
    require(df, src, [TIME, PROMPT, OUTPUT, HASHES])  # the bundled traces have every column
    return assemble(k.name, rows(df, src, k, BLOCK), k)


for _name in FILES:
    TRACES.register(_name, load)
