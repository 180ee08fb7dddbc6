"""Deterministic token ids.

A token id is a hash of (seed, stream, key, position), reduced to [0, vocab_size). The key
is a request's rid for ids no one else shares, a block id for a prefix block, or a group for
a synthetic shared prefix. So the same block id always expands to the same ids, the first k
ids of a request do not depend on how long it is, and nothing depends on which other rows
were loaded. The key mixing is a bijection of the 64-bit key, so two different keys hash
every position differently: single ids coincide by chance (1 in vocab_size), a run of them
practically never, so a prefix cache sees sharing only where the trace means it.
"""
from __future__ import annotations

import numpy as np

from .streams import BLOCK_IDS, UNIQUE_IDS

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer, in place on a uint64 array (a bijection)."""
    tmp = np.empty_like(x)
    np.right_shift(x, np.uint64(30), out=tmp)
    x ^= tmp
    x *= _M1
    np.right_shift(x, np.uint64(27), out=tmp)
    x ^= tmp
    x *= _M2
    np.right_shift(x, np.uint64(31), out=tmp)
    x ^= tmp
    return x


def key_bases(seed: int, stream: int, keys: np.ndarray) -> np.ndarray:
    """uint64 base of each key; distinct keys give distinct bases."""
    salt = _mix(np.array([seed], dtype=np.uint64) * _GOLDEN + np.uint64(stream))
    x = np.asarray(keys, dtype=np.int64).astype(np.uint64)  # negative ids wrap, still distinct
    x ^= salt[0]
    return _mix(x)


_CHUNK = 1 << 18  # tokens hashed at a time: temporaries stay small and are reused


def _ids(bases: np.ndarray, positions: np.ndarray, vocab: int) -> np.ndarray:
    """int32 id of each (base, position) pair; bases and positions broadcast."""
    x = np.multiply(positions.astype(np.uint64, copy=False), _GOLDEN)
    x = x + bases  # broadcasting allocates the full shape
    _mix(x)
    x >>= np.uint64(32)
    x *= np.uint64(vocab)  # < 2**63: (32-bit value) * (vocab < 2**31)
    x >>= np.uint64(32)
    return x.astype(np.int32)


def keyed_table(seed: int, stream: int, keys: np.ndarray, length: int, vocab: int) -> np.ndarray:
    """(len(keys), length) int32: row i is the first `length` ids of key i."""
    bases = key_bases(seed, stream, keys)
    out = np.empty((len(bases), length), dtype=np.int32)
    pos = np.arange(length, dtype=np.uint64)[None, :]
    step = max(1, _CHUNK // max(length, 1))
    for a in range(0, len(bases), step):
        out[a:a + step] = _ids(bases[a:a + step, None], pos, vocab)
    return out


def keyed_runs(seed: int, stream: int, keys: np.ndarray, starts: np.ndarray,
               lens: np.ndarray, vocab: int) -> list[np.ndarray]:
    """For each i, the ids of key i at positions starts[i] .. starts[i] + lens[i] - 1.
    The arrays are views into one buffer per chunk of about _CHUNK tokens (consecutive
    keys), so a replay that drops the ids of its finished requests frees them chunk by chunk."""
    lens = np.asarray(lens, dtype=np.int64)
    starts = np.asarray(starts, dtype=np.int64)
    n = len(lens)
    if n == 0:
        return []
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    bases = key_bases(seed, stream, keys)
    runs: list[np.ndarray] = []
    a = 0
    while a < n:  # whole requests, about _CHUNK tokens at a time
        b = int(np.searchsorted(offsets, offsets[a] + _CHUNK, side="right")) - 1
        b = min(max(b, a + 1), n)
        seg = lens[a:b]
        local = offsets[a:b] - offsets[a]
        pos = np.arange(int(offsets[b] - offsets[a]), dtype=np.int64) - np.repeat(local - starts[a:b], seg)
        runs.extend(np.split(_ids(np.repeat(bases[a:b], seg), pos, vocab), local[1:]))
        a = b
    return runs


def unique_ids(seed: int, rids: np.ndarray, lens: np.ndarray, vocab: int) -> list[np.ndarray]:
    """Independent ids for requests that share nothing (keyed by rid)."""
    return keyed_runs(seed, UNIQUE_IDS, rids, np.zeros(len(lens), np.int64), lens, vocab)


def block_ids(seed: int, blocks: list[np.ndarray], rids: np.ndarray, lens: np.ndarray,
              block_size: int, vocab: int) -> tuple[list[np.ndarray], int]:
    """Each request's prompt from its prefix block ids: block id b always expands to the same
    block_size ids (one table row per distinct id, built once per call), concatenated and
    cut to the request's length (the last block may be partial). A request longer than its
    blocks is padded with ids of its own (keyed by rid). Returns (prompts, padded): padded
    is how many requests needed padding."""
    need = [min(len(b), -(-int(n) // block_size)) for b, n in zip(blocks, lens)]
    used = [np.asarray(b[:k], dtype=np.int64) for b, k in zip(blocks, need)]
    flat = np.concatenate(used) if used else np.zeros(0, np.int64)
    uniq, inverse = np.unique(flat, return_inverse=True)
    table = keyed_table(seed, BLOCK_IDS, uniq, block_size, vocab)
    out: list[np.ndarray] = []
    pad_rows, pad_rids, pad_starts, pad_lens = [], [], [], []
    at = 0
    for i, (b, k, n) in enumerate(zip(blocks, need, lens)):
        n = int(n)
        ids = table[inverse[at:at + k]].reshape(-1)[:n]
        at += k
        if len(ids) < n:
            pad_rows.append(i)
            pad_rids.append(int(rids[i]))
            pad_starts.append(len(ids))
            pad_lens.append(n - len(ids))
        out.append(ids)
    if pad_rows:
        pads = keyed_runs(seed, UNIQUE_IDS, np.array(pad_rids), np.array(pad_starts),
                          np.array(pad_lens), vocab)
        for i, pad in zip(pad_rows, pads):
            out[i] = np.concatenate([out[i], pad])
    return out, len(pad_rows)
