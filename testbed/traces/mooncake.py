"""Mooncake (Kimi) traces: JSONL with timestamp (ms), input_length, output_length and
hash_ids (one id per 512-token prefix block; equal ids at equal positions are shared KV)."""
from __future__ import annotations


from .assemble import Rows, assemble
from .base import TRACES, Trace
from .columns import find_file, float_column, int_column, int_list, read_jsonl, require
from .config import TraceConfig
from .token_ids import block_ids

FILES = {
    "mooncake_conversation": "mooncake_conversation.jsonl",
    "mooncake_synthetic": "mooncake_synthetic.jsonl",
}
BLOCK = 512  # tokens per hash_id block, fixed by the trace
TIME, PROMPT, OUTPUT, HASHES = "timestamp", "input_length", "output_length", "hash_ids"


def load(k: TraceConfig) -> Trace:
    path = find_file(k.path, FILES[k.name], k.name)
    df, src = read_jsonl(path)
    require(df, src, [TIME, PROMPT, OUTPUT, HASHES])
    prompt, _ = int_column(df, src, PROMPT, minimum=1)
    output, _ = int_column(df, src, OUTPUT, minimum=1)
    times_ms = float_column(df, src, TIME)
    hashes = df[HASHES].to_numpy()
    notes = [f"token ids: each hash_id expands to the same {BLOCK} ids (seed {k.seed}, vocab "
             f"{k.vocab_size}), concatenated and cut to input_length (last block partial)"]

    def make_ids(take, rids, lens):
        blocks = []
        for i in take:  # hash_ids are checked only for the rows taken
            b = int_list(hashes[i], src, int(i), HASHES)
            if b is None:
                raise src.error(int(i), HASHES, "is missing (need a list, possibly empty)")
            blocks.append(b)
        ids, padded = block_ids(k.seed, blocks, rids, lens, BLOCK, k.vocab_size)
        full = -(-prompt[take] // BLOCK)  # blocks the untruncated input_length covers
        unused = int(sum(len(b) > f for b, f in zip(blocks, full)))
        if padded:
            notes.append(f"{padded} requests are longer than their hash_ids blocks: padded with ids of their own")
        if unused:
            notes.append(f"{unused} requests have more hash_ids blocks than input_length covers: "
                         f"the extra blocks are unused")
        return ids

    rows = Rows(
        src=src,
        prompt_len=prompt,
        output_len=output,
        arrival_s=times_ms / 1000.0,
        arrival_what=f"{TIME} ms / 1000",
        make_ids=make_ids,
        notes=notes,
    )
    return assemble(k.name, rows, k)


for _name in FILES:
    TRACES.register(_name, load)
