"""KV reservation at admission (policy.reserve): how many pages running requests are
assumed to still need, and what a new admission needs."""
from __future__ import annotations

from testbed.core import Request, SchedulerView

from policies.base import pages_for


class FullReserve:
    """Reserve every running request's remaining max tokens: never preempts (mini-SGLang)."""
    ratio = 1.0

    def observe(self, view: SchedulerView) -> None:
        pass

    def holds_over_decodes(self, view: SchedulerView) -> bool:
        """Whether an admission's need and the KV left (free + evictable - running_pages) are
        as they were after a decode step of every running request (no eviction): a page taken
        from the pool is a page held, and the reservation counts held pages off."""
        return True

    def skip(self, k: int) -> None:
        """k steps observed without a preemption."""

    def running_pages(self, view: SchedulerView) -> int:
        p = view.page_size
        held = view.pages_held  # looked up once: it is called for every running request
        if p == 1:
            return sum(r.prompt_len + r.max_new_tokens - 1 - held(r) for r in view.running)
        return sum(pages_for(r.max_len - 1, p) - held(r) for r in view.running)

    def admission_pages(self, view: SchedulerView, r: Request, hit: int) -> int:
        # the last output token is never fed back, so it needs no KV
        prompt = r.device_len
        return pages_for(prompt + int(self.ratio * (r.max_len - 1 - prompt)), view.page_size) - hit // view.page_size


class EstimateReserve(FullReserve):
    """Reserve a decaying fraction of remaining output and rely on preemption when the
    estimate is wrong (SGLang's new_token_ratio idea)."""

    def __init__(self, init: float, minimum: float, decay: float):
        self.init, self.minimum, self.decay = init, minimum, decay
        self.ratio = init
        self._seen_preemptions = 0

    def observe(self, view: SchedulerView) -> None:
        if view.num_preemptions > self._seen_preemptions:
            self._seen_preemptions = view.num_preemptions
            self.ratio = self.init
        else:
            self.skip(1)

    def holds_over_decodes(self, view: SchedulerView) -> bool:
        """The ratio moves every step, and with it what admissions may use: only an empty
        queue stays without admissions for sure."""
        return not view.waiting

    def skip(self, k: int) -> None:
        for _ in range(k):  # one subtraction a step, as observe makes them (the floats round alike)
            self.ratio = max(self.minimum, self.ratio - self.decay)

    def running_pages(self, view: SchedulerView) -> int:
        p = view.page_size
        held = view.pages_held
        # the known tokens in full, each request rounded up to its own pages; a share of the rest
        known = sum(max(0, pages_for(r.device_len, p) - held(r)) for r in view.running)
        output_left = sum(r.max_len - 1 - r.device_len for r in view.running)
        return known + pages_for(int(self.ratio * output_left), p)


def make_reserve(cfg):
    if cfg.reserve == "full":
        return FullReserve()
    if cfg.reserve == "estimate":
        return EstimateReserve(cfg.estimate_init, cfg.estimate_min, cfg.estimate_decay)
    raise ValueError(f"unknown policy.reserve {cfg.reserve!r}; known: full, estimate")
