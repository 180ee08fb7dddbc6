"""How long one scheduler step's per-request work takes when the ledger is row arrays and the plan
carries row indices (the redesign the slot-array experiment pointed at), on a 256-request chunked step: plan
check, page needs, page scatter, ledger advance, synthetic tokens, results and end detection,
all numpy over the plan's rows; P = 1 pages. A measured floor for the redesign, not the design
(README.md beside it).

    python benchmarks/results/sim_speed_experiments/step_floor.py
"""
import time
import numpy as np

R, W = 256, 32768
rng = np.random.default_rng(0)
cached = rng.integers(100, 3000, R).astype(np.int64)
device = cached + 1
pages = cached.copy()
max_len = device + rng.integers(10, 800, R)
prompt = cached - 50
inflight = np.zeros(R, np.int64)
out_len = np.zeros(R, np.int64)
stamp = np.zeros(R, np.int64)
running = np.ones(R, bool)
rid = np.arange(R, dtype=np.int64) * 7
table = np.zeros((R, W), np.int32)
flat = table.reshape(-1)
free = np.arange(10_000_000, dtype=np.int64)
free_top = len(free)
times = np.zeros((R, 1024))

def step(s, now):
    global free_top
    # the plan: 255 decode rows and one chunk of 257 tokens (row 255 mid-prefill)
    rows = np.arange(R, dtype=np.int64)
    n = np.ones(R, np.int64); n[-1] = 257
    cached[-1] = pages[-1] = 100  # the chunk row starts over (its context stays within the table)
    device[-1] = cached[-1] + 257
    # check
    if (stamp[rows] == s).any(): raise ValueError
    stamp[rows] = s
    ext = device[rows] - cached[rows]
    if not (running[rows].all() and ((n >= 1) & (n <= ext)).all()): raise ValueError
    # page needs (P = 1) and the allocation
    c = cached[rows]
    need = np.maximum(c + n - pages[rows], 0)
    total = int(need.sum())
    new = free[free_top - total:free_top]; free_top -= total
    # scatter: one page each for the decodes, a slice for the chunk
    dec = need == 1
    pos = rows[dec] * W + pages[rows[dec]]
    flat[pos] = new[:int(dec.sum())]
    flat[rows[-1] * W + pages[rows[-1]]: rows[-1] * W + pages[rows[-1]] + int(need[-1])] = new[int(dec.sum()):]
    pages[rows] += need
    # advance
    cached[rows] = c + n
    samples = c + n == device[rows]
    device[rows] += samples
    inflight[rows] += 1
    kv = int(c.sum()) + int(n.sum())
    # synthetic tokens
    srows = rows[samples]
    toks = (rid[srows] * 1_000_003 + device[srows]) % 1_000_000_000 + 1_000_000_000
    # complete
    inflight[rows] -= 1
    k = out_len[srows] % 1024
    times[srows, k] = now
    out_len[srows] += 1
    ended = srows[out_len[srows] >= max_len[srows] - prompt[srows]]
    return kv, toks, ended

for s in range(200):
    step(s + 1, s * 0.01)
N = 3000
t = time.perf_counter()
for s in range(N):
    step(s + 1000, s * 0.01)
dt = (time.perf_counter() - t) / N
print(f"{dt * 1e6:.1f} us a 256-request step (row arrays, numpy)")
