"""The one step protocol both drivers run: admit arrivals, schedule, launch, collect the
step in flight, complete.

With overlap (the engine's default) the host schedules and launches step N+1 while the
device runs step N, and N's tokens become visible when N is collected, after N+1 has been
launched; without it each step is collected right after its launch. The loop is a
generator that yields the clock times it must wait until; the driver owns the clock: the
wall-clock driver sleeps, the SimPy driver advances simulated time. Executors return a
handle from `launch(plan)` and a StepResult from `collect(handle)`; a handle's `host_done`,
`ready_at` and `complete_cost` are the simulator's modelled times (None on the engine,
where the host's own work takes real time and `collect` blocks on the device).

Requests come from a feed: a trace's requests at their arrival times (TraceFeed), or, on a
server, the messages that arrive (testbed.serve.feed). The feed also hears what each
step delivered, so a server can stream it; the loop ends once the feed says nothing more
will come and the scheduler has no work left.
"""
from __future__ import annotations

from array import array
from typing import Any, Callable, Iterator, Protocol

from testbed.core import BatchPlan, StepResult
from testbed.recording import record_step
from testbed.timeline import StepLog


class Executor(Protocol):
    """Runs plans: the simulator's (modelled times), the engine's, or its tensor-parallel wrapper."""

    def launch(self, plan: BatchPlan) -> Any: ...

    def collect(self, handle: Any) -> StepResult: ...

    def close(self, ran_to_end: bool) -> None:
        """The run is over: stop what the executor started (TP ranks; gracefully only when no
        step was cut short)."""

    def fill_predictions(self, steps: StepLog) -> None:
        """After the run: the predicted step times it kept out of the timed loop."""


class Feed(Protocol):
    """Where the loop's requests come from and where what the steps delivered goes."""
    requests: list  # every request it has handed over (the run's rows)

    def admit(self, sched, now: float) -> None:
        """Hand the scheduler what has arrived by `now` (requests; on a server, aborts too)."""

    def next_arrival(self) -> float | None:
        """When the loop, with nothing to run, must look again (math.inf: whenever something
        arrives); None: nothing more will come."""

    def delivered(self, plan: BatchPlan, now: float) -> None:
        """A step's tokens are in its requests' ledgers (and those it ended are terminal)."""


class TraceFeed:
    """A trace's requests, each admitted once the clock reaches its arrival time."""

    def __init__(self, requests):
        # a trace's TraceRequests (testbed.assemble) are in that order already, and made as read
        ordered = getattr(requests, "in_arrival_order", False)
        self.requests = requests if ordered else sorted(requests, key=lambda r: (r.arrival, r.rid))
        self._n = len(self.requests)
        self._next = 0
        self._head = self.requests[0] if self._n else None  # the next to arrive (read every step)

    def admit(self, sched, now: float) -> None:
        while self._head is not None and self._head.arrival <= now:
            r = self._head
            r.make_ids()  # a trace's lazy ids are made as the request arrives
            sched.add_request(r, now)
            self._next += 1
            self._head = self.requests[self._next] if self._next < self._n else None

    def next_arrival(self) -> float | None:
        return None if self._head is None else self._head.arrival

    def delivered(self, plan: BatchPlan, now: float) -> None:
        """A replay streams nothing: the ledgers are written at the end."""


class Driver(Protocol):
    """What a run drives: the step loop on some clock. `close` always follows `run`, however it ended."""
    executor: Executor
    steps: StepLog
    progress: Callable | None

    def run(self) -> None: ...

    def close(self) -> None: ...


class StepLoop:
    def __init__(self, scheduler, executor, requests=(), overlap: bool = True, progress=None, feed=None):
        """requests: a trace's, replayed at their arrival times; or feed: where requests come from."""
        self.sched = scheduler
        self.executor = executor
        self.feed = feed if feed is not None else TraceFeed(requests)
        self.overlap = overlap
        self.progress = progress  # callable(done, total, now, output_tokens) or None
        self.steps = StepLog()
        self.ran_to_end = False  # the loop returned normally (no step cut short)
        self._rows = None  # stream_rows' sink, or None
        self._seen_done = 0  # sched.done[:_seen_done] were looked at
        self._ended: list = []  # ended, their rows not yet taken (a step in flight holds their KV)
        # runs steady stretches at once after a step (the simulator's fast path,
        # testbed/sim/fastpath.py): run(plan, before, inflight) -> the new step in flight; or None
        self.steady = None

    def stream_rows(self, rows) -> None:
        """Hand each request's row to `rows` (testbed.timeline.RequestRows) once it has ended
        and given up its KV, then drop its per-token lists and token ids: a long replay holds
        the history of the requests not yet done only. For runs whose requests are not read
        after the loop (the run's files are written from `rows`)."""
        self._rows = rows

    @property
    def requests(self) -> list:
        return self.feed.requests

    def close(self) -> None:
        self.executor.close(self.ran_to_end)

    def loop(self, now: Callable[[], float]) -> Iterator[float]:
        """The loop; yields times to wait until (the driver waits, then resumes it)."""
        sched, feed, ex = self.sched, self.feed, self.executor
        inflight = None
        while True:
            t = now()
            feed.admit(sched, t)
            plan = sched.schedule(t)
            handle = None
            if plan is not None:
                t_launch = now()
                handle = ex.launch(plan)
                if handle.host_done is not None and handle.host_done > t_launch:
                    yield handle.host_done
                handle = (handle, t, t_launch, now())
            finished_one = inflight is not None
            before = None
            if inflight is not None:
                before = inflight[0].plan
                yield from self._finish(inflight, now)
                inflight = None
            if handle is not None:
                if self.overlap:
                    inflight = handle
                else:
                    yield from self._finish(handle, now)
                if self.steady is not None:
                    inflight = yield from self.steady.run(plan, before, inflight)
                continue
            if finished_one:  # its results may make something runnable
                continue
            t_next = feed.next_arrival()
            if t_next is None:
                if not sched.has_work():
                    self.ran_to_end = True
                    return
                raise RuntimeError(f"scheduler stalled at t={t:.3f}s with {len(sched.waiting)} waiting and "
                                   f"{len(sched.running)} running requests and nothing runnable")
            # nothing in flight and nothing runnable: nothing changes before the next arrival
            yield t_next

    def _stream_ended(self) -> None:
        done = self.sched.done
        if len(done) > self._seen_done:
            self._ended.extend(done[self._seen_done:])
            self._seen_done = len(done)
        if not self._ended:
            return
        still = []
        for r in self._ended:
            if r.row >= 0:  # released when the step in flight completes: the cache may still read its ids
                still.append(r)
                continue
            self._rows.add(r)
            r.token_times, r.output_ids, r.chunk_times, r.preempt_times = array("d"), [], [], []
            r.prompt_ids = None
        self._ended = still

    def _finish(self, launched, now: Callable[[], float]) -> Iterator[float]:
        """Collect a launched step, apply its result and record it. launched: the executor's
        handle and the loop times the step was scheduled, launch was called and it returned."""
        h, t_sched, t_launch, t_launched = launched
        if h.ready_at is not None and h.ready_at > now():
            yield h.ready_at
        result = self.executor.collect(h)
        t = now()
        self.sched.complete(h.plan, result, t)
        self.feed.delivered(h.plan, t)  # before the bookkeeping: a server streams the tokens now
        if self._rows is not None:
            self._stream_ended()
        if h.complete_cost:
            yield t + h.complete_cost
        if self.progress is not None:
            self.progress(len(self.sched.done), len(self.requests), t, self.steps.output_tokens)
        host = (t_launch - t_sched) + h.prep_s  # schedule, batch build, upload: before the device can start
        launch = max(0.0, t_launched - t_launch - h.prep_s)  # enqueueing the kernels
        record_step(self.steps, self.sched, h.plan, t_sched, t, result.duration, result.predicted,
                    host, launch, 0.0)
        self.steps.set_last("complete_s", now() - t)  # applying the result, progress and this record
