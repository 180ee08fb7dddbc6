"""The client's driver: the trace's requests sent at their arrival times on the wall clock
(at most backend.max_concurrency in flight; the rest wait for a slot), each streamed on its
own task. It has no scheduler and no steps: the server has those. Ctrl-C or SIGTERM stops
it; the records keep what came (requests in flight stay RUNNING, those still waiting for a
slot WAITING) and testbed.run writes them."""
from __future__ import annotations

import asyncio
import signal
import threading
import time

from testbed.client.record import ClientRecord
from testbed.client.stream import send
from testbed.timeline import StepLog


class HttpDriver:
    def __init__(self, url: str, records: list[ClientRecord], bodies: list[dict | None],
                 max_concurrency: int | None, timeout_s: float):
        """bodies[i]: records[i]'s request, or None for one not to send (rejected here)."""
        order = sorted(range(len(records)), key=lambda i: (records[i].arrival, records[i].rid))
        self.records = [records[i] for i in order]
        self.bodies = [bodies[i] for i in order]
        self.url = url
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.arrived: list[ClientRecord] = []  # the records whose arrival time has come
        self.steps = StepLog()  # a client sees no steps: steps.parquet is empty
        self.progress = None  # callable(done, total, now, output_tokens) or None
        self._done = self._tokens = 0
        self._stop = None  # the exception a signal asked for
        self.clock_origin = None  # t=0 of the records' times as a perf_counter() value, once running

    def run(self) -> None:
        main_thread = threading.current_thread() is threading.main_thread()
        old = signal.getsignal(signal.SIGTERM) if main_thread else None
        try:
            asyncio.run(self._main())
        except asyncio.CancelledError:  # SIGTERM cancelled the run
            if self._stop is None:
                raise
        finally:
            if main_thread:
                signal.signal(signal.SIGTERM, old)  # the loop's close left it at the default
        if self._stop is not None:  # now the handler that was there acts on it (testbed.run's: Terminated)
            signal.raise_signal(signal.SIGTERM)

    def close(self) -> None:
        """Nothing outlives run(): its connections close with it."""

    async def _main(self) -> None:
        main = asyncio.current_task()
        if threading.current_thread() is threading.main_thread():  # Ctrl-C: asyncio.run cancels it itself
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self._terminate, main)
        t0 = self.clock_origin = time.perf_counter()

        def clock() -> float:
            return time.perf_counter() - t0
        slots = asyncio.Semaphore(self.max_concurrency) if self.max_concurrency else None
        async with asyncio.TaskGroup() as tasks:
            for rec, body in zip(self.records, self.bodies):
                wait = rec.arrival - clock()
                if wait > 0:
                    await asyncio.sleep(wait)
                self.arrived.append(rec)
                if body is None:
                    self._ended(clock)
                else:
                    tasks.create_task(self._one(slots, rec, body, clock))

    async def _one(self, slots, rec: ClientRecord, body: dict, clock) -> None:
        if slots is None:
            await send(self.url, body, rec, clock, self.timeout_s)
        else:
            async with slots:
                await send(self.url, body, rec, clock, self.timeout_s)
        self._tokens += rec.output_tokens
        self._ended(clock)

    def _ended(self, clock) -> None:
        self._done += 1
        if self.progress is not None:
            self.progress(self._done, len(self.records), clock(), self._tokens)

    def _terminate(self, main: asyncio.Task) -> None:
        self._stop = "SIGTERM"
        main.cancel()
