"""/metrics in the Prometheus text format: the scheduler's state after its latest event
(running / waiting requests, KV pages), and TTFT / ITL histograms measured at the HTTP
server (from a request's arrival there to its first text, and between tokens)."""
from __future__ import annotations

import bisect

from testbed.serve.messages import KVCheck, SchedulerStats

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
PREFIX = "testbed_"


class Histogram:
    def __init__(self, name: str, help: str, buckets):
        self.name, self.help, self.buckets = PREFIX + name, help, tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # the last: above every bucket
        self.sum = 0.0

    def observe(self, v: float, n: int = 1) -> None:
        self.counts[bisect.bisect_left(self.buckets, v)] += n
        self.sum += v * n

    def render(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        total = 0
        for le, c in zip(self.buckets, self.counts):
            total += c
            out.append(f'{self.name}_bucket{{le="{le}"}} {total}')
        total += self.counts[-1]
        out += [f'{self.name}_bucket{{le="+Inf"}} {total}', f"{self.name}_sum {self.sum}",
                f"{self.name}_count {total}"]
        return out


class ServerMetrics:
    def __init__(self):
        self.ttft = Histogram("time_to_first_token_seconds", "HTTP arrival to the first text of a request",
                              TTFT_BUCKETS)
        self.itl = Histogram("inter_token_latency_seconds", "time between a request's output tokens", ITL_BUCKETS)
        self.stats: SchedulerStats | None = None
        self.kv_check: KVCheck | None = None  # the latest idle KV check (serve.idle_kv_check)
        self.finished: dict[str, int] = {}  # finish reason -> requests
        self.prompt_tokens = 0
        self.generation_tokens = 0

    def render(self) -> str:
        lines: list[str] = []

        def metric(name, kind, help, value, labels=""):
            lines.extend([f"# HELP {PREFIX}{name} {help}", f"# TYPE {PREFIX}{name} {kind}",
                          f"{PREFIX}{name}{labels} {value}"])
        s = self.stats or SchedulerStats(0, 0, 0, 0, 0, 0)
        metric("num_requests_running", "gauge", "requests the scheduler runs", s.running)
        metric("num_requests_waiting", "gauge", "requests waiting to be admitted", s.waiting)
        metric("kv_pages_used", "gauge", "KV pages held by requests", s.pages_used)
        metric("kv_pages_cached", "gauge", "KV pages held by the prefix cache only", s.pages_cached)
        metric("kv_pages_free", "gauge", "free KV pages", s.pages_free)
        metric("kv_pages_total", "gauge", "KV pages in the pool", s.num_pages)
        metric("prompt_tokens_total", "counter", "prompt tokens of finished requests", self.prompt_tokens)
        metric("generation_tokens_total", "counter", "tokens generated for finished requests",
               self.generation_tokens)
        if self.kv_check is not None:
            c = self.kv_check
            metric("kv_idle_checks_total", "counter", "KV integrity checks run when the scheduler went idle", c.number)
            metric("kv_idle_check_ok", "gauge", "the latest idle KV check passed (1) or failed (0)", int(c.ok))
            metric("kv_idle_check_pages_in_use", "gauge", "KV pages held by requests at the latest idle check "
                   "(0 unless leaked; -1: the check itself failed)", -1 if c.in_use is None else c.in_use)
        name = f"{PREFIX}requests_finished_total"
        lines += [f"# HELP {name} requests ended, by finish reason", f"# TYPE {name} counter"]
        lines += [f'{name}{{finish_reason="{k}"}} {v}' for k, v in sorted(self.finished.items())]
        lines += self.ttft.render() + self.itl.render()
        return "\n".join(lines) + "\n"
