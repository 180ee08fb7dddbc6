# Experiment kept for its record (README.md beside it), not installed: it went in as testbed/sim/turns.py,
# with SimExecutor.place moved to a module-level place(wake, ...) in testbed/sim/executor.py.
"""A fast-path stretch's turns placed on the timeline (testbed/sim/fastpath.py), float for float
as the step loop and SimExecutor.place would place them one by one.

A turn schedules and launches step j, then collects step j - 1 (with overlap) or step j itself
(without). `scalar_turns` is that arithmetic turn by turn. `overlap_turns` places many turns at
once with numpy by guess and check: with the device the bottleneck (each step starts when the
one before ends, and the host's launch is done by then) the ends are a running sum of the
device times and each turn's clock follows from the end of the step it collects; every turn's
formula is then evaluated elementwise on the guess, as `scalar_turns` computes it (the same
IEEE operations: numpy's elementwise float64 arithmetic is Python's), and the turns whose
inputs the formulas reproduce are taken: by induction from the first turn, whose inputs are
exact, each taken turn's values are the one-by-one values. The first turn the guess misses (a
host-bound stretch, a wake) and what follows go through `scalar_turns`.

A turn's row: (start, end, duration, predicted, host, launch, complete) of the step it
collects, as the loop records it (StepLoop._finish); `pend`: the step in flight's
(scheduled, launch called, launch returned, host, host_done, ready_at, duration, predicted,
complete cost).
"""
from __future__ import annotations

import numpy as np

from testbed.sim.executor import place

ROW_FIELDS = 7  # start, end, duration, predicted, host, launch, complete
VECTOR_FROM = 48  # turns a chunk must hold for numpy to beat the loop (~40 array calls of ~1 us each)


def land(now: float, t: float) -> float:
    """Where the SimPy driver's clock is after the loop waits until t (a timeout of t - now):
    t itself for 0 <= now <= t (tests/test_fastpath.py), so the one wait at the end of a
    stretch lands where its steps' waits did."""
    return now + (t - now) if t > now else now


def _land(now: np.ndarray, t: np.ndarray) -> np.ndarray:
    """land() elementwise."""
    return np.where(t > now, now + (t - now), now)


def _max(a, b):
    """Python's max(a, b) elementwise: b only where it is larger (equal values keep a)."""
    return np.where(b > a, b, a)


def scalar_turns(place, overlap: bool, state, costs, nxt: float):
    """Turns one by one while the next arrival is after the clock (a turn at or after it would
    admit it). state: [clock, device_free, applied, pend] (pend: None without overlap), moved on
    in place; costs: host, launch, device, complete arrays, one value a turn. Returns the
    rows of the turns run."""
    clock, free, applied, pend = state
    rows = []
    for host, launch, device, complete in zip(*(np.asarray(c).tolist() for c in costs)):
        if not nxt > clock:
            break
        t = clock
        prep, host_done, ready, dur, free, applied = place(t, host, launch, device, complete, free, applied)
        clock = land(clock, host_done)
        cur = (t, t, clock, prep, host_done, ready, dur, device, complete)
        ts, tl, tld, f_prep, _, f_ready, f_dur, f_pred, f_cc = pend if overlap else cur
        clock = land(clock, f_ready)
        tc = clock
        if f_cc:
            clock = land(clock, tc + f_cc)
        rows.append((ts, tc, f_dur, f_pred, (tl - ts) + f_prep, max(0.0, tld - tl - f_prep), clock - tc))
        pend = cur
    state[:] = clock, free, applied, pend
    return [np.array(c, float) for c in zip(*rows)] if rows else [np.zeros(0)] * ROW_FIELDS


def overlap_turns(wake, state, costs, nxt: float):
    """scalar_turns with overlap, the turns the guess holds for placed at once (see the module
    docstring); the rest one by one. wake: the executor's (gap, host factor, launch factor,
    device s) or None."""
    host, launch, device, complete = (np.broadcast_to(np.asarray(c, float), np.shape(costs[2])) for c in costs)
    n = len(device)
    clock, free, applied, pend = state
    if n < VECTOR_FROM or applied is None:
        return scalar_turns(_placer(wake), True, state, costs, nxt)
    p_ts, p_tl, p_tld, p_prep, _, p_end, p_dur, p_pred, p_cc = pend
    # the guess: step j starts as j - 1 ends (E: ends, E0 the step in flight's); turn j collects
    # step j - 1 at its end and then applies it
    E = np.cumsum(np.concatenate([[free], device]))  # a running sum adds in order, as the loop does
    PE = np.concatenate([[p_end], E[1:-1]])  # the end of the step each turn collects
    PCC = np.concatenate([[p_cc], complete[:-1]])
    T_next = np.where(PCC != 0, _land(PE, PE + PCC), PE)  # the clock after each turn
    T = np.concatenate([[clock], T_next[:-1]])  # each turn's clock: turn 1's is exact
    # each turn's formulas on the guess, as scalar_turns computes them
    Free = E[:-1]  # the device is free when the step before ends (turn 1: exact)
    Applied = np.concatenate([[applied], E[1:-1] + complete[:-1]])
    h, lc, d = host, launch, device
    if wake is not None:
        w = (T - Applied) > wake[0]
        h, lc, d = np.where(w, host * wake[1], host), np.where(w, launch * wake[2], launch), np.where(
            w, device + wake[3], device)
    ready = T + h
    start = _max(Free, ready)
    hd = ready + lc
    end = _max(start + d, hd)
    dur = end - start
    tld = _land(T, hd)
    tc = _land(tld, PE)
    after = np.where(PCC != 0, _land(tc, tc + PCC), tc)
    # turn j's inputs are exact while the turns before reproduce the guess (its clock, the end)
    bad = np.flatnonzero((after[:-1] != T[1:]) | (end[:-1] != E[1:-1]))
    good = int(bad[0]) + 1 if len(bad) else n  # turns whose values are the one-by-one values
    late = np.flatnonzero(T[:good] >= nxt)  # a turn at or after the next arrival is not run
    m = int(late[0]) if len(late) else good
    if m == 0:
        return scalar_turns(_placer(wake), True, state, costs, nxt)
    # each turn's row: the step it collects (turn 1: the one in flight), as the loop records it
    ts, tl = np.concatenate([[p_ts], T[:m - 1]]), np.concatenate([[p_tl], T[:m - 1]])
    tld_p = np.concatenate([[p_tld], tld[:m - 1]])
    prep = np.concatenate([[p_prep], h[:m - 1]])
    rows = [ts, tc[:m], np.concatenate([[p_dur], dur[:m - 1]]), np.concatenate([[p_pred], device[:m - 1]]),
            (tl - ts) + prep, _max(0.0, tld_p - tl - prep), after[:m] - tc[:m]]
    i = m - 1
    state[:] = (float(after[i]), float(end[i]), float(end[i] + complete[i]),
                (float(T[i]), float(T[i]), float(tld[i]), float(h[i]), float(hd[i]), float(end[i]), float(dur[i]),
                 float(device[i]), float(complete[i])))
    if m < n and state[0] < nxt:  # the guess missed here: on one by one
        more = scalar_turns(_placer(wake), True, state, [c[m:] for c in (host, launch, device, complete)], nxt)
        rows = [np.concatenate([a, b]) for a, b in zip(rows, more)]
    return rows


def _placer(wake):
    """SimExecutor's placing of a step, for an executor with this wake."""
    return lambda *a: place(wake, *a)
