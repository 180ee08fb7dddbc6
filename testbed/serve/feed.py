"""The scheduler process's side of serving: the step loop's feed (testbed.steploop.Feed)
is the scheduler's inbox of messages instead of a trace, and its driver waits on that inbox
when there is nothing to run. The scheduler and the loop are the replay's, unchanged."""
from __future__ import annotations

import math
import os
import time

import zmq

from testbed.core import Request, RequestState
from testbed.engine.driver import RealtimeDriver
from testbed.kv.integrity import IntegrityError
from testbed.serve.messages import Abort, KVCheck, SchedulerStats, Shutdown, TokenBatch, TokenizedReq, TokenOut

POLL_S = 1.0  # an idle wait looks this often whether the launcher is still there


class MessageFeed:
    def __init__(self, inbox: zmq.Socket, outbox: zmq.Socket, eos_token_ids: tuple[int, ...],
                 idle_kv_check: bool = False):
        self.inbox = inbox  # TokenizedReq, Abort, Shutdown
        self.outbox = outbox  # TokenBatch to the detokenizer
        self.eos = tuple(eos_token_ids)
        self.requests: list[Request] = []  # every request received (the run's rows)
        self.live: dict[int, Request] = {}  # rid -> a request that has not ended
        self.sent: dict[int, int] = {}  # rid -> output tokens already sent
        self.received: set[int] = set()  # every rid received
        self.aborted_early: set[int] = set()  # aborts that came before their request (still tokenizing)
        self.stopping = False
        self.launcher_gone = False
        self.parent = os.getppid()
        self._sched = None
        self.idle_kv_check = idle_kv_check  # check the KV pool each time the scheduler goes idle
        self.kv_checks = 0
        self._events = 0  # batches sent: something happened since the last idle check
        self._checked_at = -1
        self.clock_origin: float | None = None  # the driver's t=0 as a perf_counter() value (ServingDriver.start_clock)

    # ---- the step loop's Feed -----------------------------------------------------------
    def admit(self, sched, now: float) -> None:
        self._sched = sched
        outs: list[TokenOut] = []
        if self.launcher_gone and not self.stopping:
            self._stop(sched, now, outs)
        while True:
            try:
                msg = self.inbox.recv_pyobj(zmq.NOBLOCK)
            except zmq.Again:
                break
            self._handle(msg, sched, now, outs)
        if outs:
            self._send(outs, sched)

    def next_arrival(self) -> float | None:
        return None if self.stopping else math.inf  # a message may come at any time

    def delivered(self, plan, now: float) -> None:
        outs = []
        for r in plan.reqs:
            if r.rid not in self.live:  # ended by a message while this step ran: already said
                continue
            n = self.sent[r.rid]
            if len(r.output_ids) > n or r.is_done:
                outs.append(TokenOut(r.rid, r.output_ids[n:], r.finish_reason if r.is_done else None))
                self.sent[r.rid] = len(r.output_ids)
                if r.is_done:
                    self._forget(r.rid)
        if outs:
            self._send(outs, self._sched)

    # ---- messages -----------------------------------------------------------------------
    def _handle(self, msg, sched, now: float, outs: list) -> None:
        if isinstance(msg, TokenizedReq):
            # arrival: when the app received it, as a replay's request arrives at its trace time (the
            # tokenizer's time and the wait for the step in flight are then in its TTFT, as there).
            # `now` is the admission pass's time, which the step it schedules also carries: a message
            # that came during the pass (a burst) has its times capped there, so that no request is
            # scheduled before it arrived (the cap moved 3 of 66 requests of a test burst by ~1 ms)
            o = self.clock_origin
            r = Request(rid=msg.rid, prompt_len=len(msg.prompt_ids), max_new_tokens=msg.max_new_tokens,
                        arrival=now if msg.received is None else min(msg.received - o, now),
                        prompt_ids=msg.prompt_ids, ignore_eos=msg.ignore_eos, eos_token_ids=self.eos,
                        sampling=msg.sampling, tokenized=None if msg.tokenized is None else min(msg.tokenized - o, now),
                        queued_at=now)
            self.requests.append(r)
            self.received.add(r.rid)
            sched.add_request(r, now)
            if r.state == RequestState.REJECTED:
                outs.append(TokenOut(r.rid, [], "rejected", r.reject_reason))
                return
            self.live[r.rid], self.sent[r.rid] = r, 0
            if self.stopping or msg.rid in self.aborted_early:  # after the shutdown, or its client is gone
                self.aborted_early.discard(msg.rid)
                self._end(r, "abort", sched, now, outs)
        elif isinstance(msg, Abort):
            r = self.live.get(msg.rid)
            if r is None:
                if msg.rid not in self.received:  # not here yet (ended ones are left as they are)
                    self.aborted_early.add(msg.rid)
                return
            self._end(r, msg.reason, sched, now, outs)
        elif isinstance(msg, Shutdown):
            self._stop(sched, now, outs)
        else:
            raise TypeError(f"scheduler inbox: unexpected message {type(msg).__name__}")

    def _end(self, r: Request, reason: str, sched, now: float, outs: list) -> None:
        sched.abort(r, now, reason)
        outs.append(TokenOut(r.rid, r.output_ids[self.sent[r.rid]:], r.finish_reason))
        self._forget(r.rid)

    def _stop(self, sched, now: float, outs: list) -> None:
        """End every request: the loop then finishes the steps in flight and returns."""
        self.stopping = True
        for r in list(self.live.values()):
            self._end(r, "abort", sched, now, outs)

    def _forget(self, rid: int) -> None:
        del self.live[rid], self.sent[rid]

    def _send(self, outs: list, sched, kv_check: KVCheck | None = None) -> None:
        kv = sched.kv
        stats = SchedulerStats(len(sched.running), len(sched.waiting), kv.owned_pages, sched.cache.cached_pages,
                               sched.allocator.free_pages, sched.cfg.num_pages, kv_check)
        self.outbox.send_pyobj(TokenBatch(outs, stats))
        self._events += 1

    def _check_idle_kv(self) -> None:
        """Once per idle spell (nothing live, nothing in flight, something happened since the
        last check): the scheduler's KV integrity check, its result to /metrics."""
        sched = self._sched
        if (not self.idle_kv_check or sched is None or self._events == self._checked_at or sched.running
                or sched.waiting or sched.inflight_steps):
            return
        self.kv_checks += 1
        try:
            in_use = sched.check_integrity()["in_use"]
            check = KVCheck(self.kv_checks, in_use == 0, in_use,
                            None if in_use == 0 else f"{in_use} KV pages held by requests with none live")
        except IntegrityError as e:
            check = KVCheck(self.kv_checks, False, None, str(e))
        self._send([], sched, check)
        self._checked_at = self._events

    # ---- the driver's idle wait ---------------------------------------------------------
    def wait(self, seconds: float) -> None:
        """Until a message arrives or `seconds` pass; a launcher gone is a shutdown."""
        self._check_idle_kv()
        deadline = time.monotonic() + seconds
        while not self.stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self.inbox.poll(int(min(left, POLL_S) * 1000) + 1):
                return
            if os.getppid() != self.parent:  # the next admit ends everything; the run's files are written
                self.launcher_gone = True
                return


class ServingDriver(RealtimeDriver):
    """The wall-clock driver whose idle wait wakes on a message."""

    def start_clock(self) -> None:
        super().start_clock()
        self.feed.clock_origin = self.clock_origin  # the stage times the messages carry go on this clock

    def wait(self, t: float) -> None:
        self.feed.wait(t - self.now())
