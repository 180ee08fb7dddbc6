"""The running requests' side of a step: advancing their ledger when a plan is applied, and
applying its result: tokens delivered, requests ended on length or EOS, a finished
prefill shared, and KV released once no step in flight uses it."""
from __future__ import annotations

from itertools import compress

import numpy as np

from testbed.core import BatchPlan, Request, RequestState
from testbed.scheduler.cache_manager import CacheManager


class DecodeManager:
    def __init__(self, running: list[Request], done: list[Request], kv: CacheManager):
        self.running = running  # the scheduler's, in admission order
        self.done = done  # the scheduler's, in the order they ended
        self.kv = kv
        self.ending: list[Request] = []  # ended, but a step in flight still uses their KV

    def live(self) -> list[Request]:
        """Every request holding a row."""
        return self.running + self.ending

    def advance(self, plan: BatchPlan, now: float) -> tuple[int, int, int]:
        """Move each item's KV on by its tokens; an item that reaches its known tokens
        samples one (pending until its step completes). Fills plan.cached_lens, plan.samples
        and plan.watch; returns (decodes, prefill items, prefill tokens)."""
        cached, samples, watch = [], [], []
        n_dec = pre_reqs = pre_tok = 0
        for r, n in zip(plan.reqs, plan.num_tokens):
            c = r.cached_len
            cached.append(c)
            d = r.device_len
            p = r.prompt_len
            if n == 1 and c == d - 1 and d > p:  # a decode
                n_dec += 1
                if d + 1 >= p + r.max_new_tokens or not r.ignore_eos:  # its last token, or one to check
                    watch.append(len(cached) - 1)
            else:
                pre_reqs += 1
                pre_tok += n
                r.chunk_times.append((now, n))
                if r.first_scheduled is None:
                    r.first_scheduled = now
                watch.append(len(cached) - 1)
            c += n
            r.cached_len = c
            if c == d:
                samples.append(True)
                r.device_len = d + 1
            else:
                samples.append(False)
            r.inflight += 1
        plan.cached_lens = np.array(cached, np.int64)
        plan.samples = np.array(samples, bool)
        plan.num_samples = samples.count(True)
        plan.kv_tokens = sum(cached) + sum(plan.num_tokens)
        plan.watch = watch
        return n_dec, pre_reqs, pre_tok

    def complete(self, plan: BatchPlan, tokens: np.ndarray, now: float) -> list[Request]:
        """Deliver a finished step's tokens (one per sampling item); returns the requests
        that ended in it. Every item takes its token in one pass; only the watched ones
        (plan.watch) are looked at after. With a request ended while the step was in flight
        (self.ending), or no watch list, each item is looked at in turn."""
        if self.ending or plan.watch is None:
            return self._complete_each(plan, tokens, now)
        reqs, toks = plan.reqs, tokens.tolist()
        if len(toks) == len(reqs):
            for r, tok in zip(reqs, toks):
                r.inflight -= 1
                r.output_ids.append(tok)
                r.token_times.append(now)
        else:
            for r in reqs:
                r.inflight -= 1
            for r, tok in zip(compress(reqs, plan.samples.tolist()), toks):
                r.output_ids.append(tok)
                r.token_times.append(now)
        ended = []
        if not plan.watch:
            return ended
        rank = None  # each sampling item's token among `toks`: only an EOS check needs it
        for i in plan.watch:
            if not plan.samples[i]:  # a prefill chunk short of the prompt's end
                continue
            r = reqs[i]
            if r.first_token is None:
                r.first_token = now
            reason = "length" if len(r.output_ids) >= r.max_new_tokens else None
            if reason is None and not r.ignore_eos:
                if rank is None:
                    rank = np.cumsum(plan.samples) - 1
                reason = "eos" if toks[rank[i]] in r.eos_token_ids else None
            if reason:
                self.finish(r, reason, now)
                ended.append(r)
            elif plan.num_tokens[i] > 1 or plan.cached_lens[i] < r.prompt_len:  # it finished a prefill
                self.kv.share_prefill(r)
        return ended

    def _complete_each(self, plan: BatchPlan, tokens: np.ndarray, now: float) -> list[Request]:
        """complete, each item looked at: those ended while the step was in flight drop their token."""
        ended = []
        toks = iter(tokens.tolist())
        TERMINAL = RequestState.FINISHED  # FINISHED, ABORTED, REJECTED are the largest states
        for r, n, s, c in zip(plan.reqs, plan.num_tokens, plan.samples.tolist(), plan.cached_lens.tolist()):
            r.inflight -= 1
            if r.state < TERMINAL:
                if not s:
                    continue
                tok = next(toks)
                out = r.output_ids
                out.append(tok)
                r.token_times.append(now)
                if r.first_token is None:
                    r.first_token = now
                if len(out) >= r.max_new_tokens:
                    self.finish(r, "length", now)
                    ended.append(r)
                elif not r.ignore_eos and tok in r.eos_token_ids:
                    self.finish(r, "eos", now)
                    ended.append(r)
                else:  # still running: its KV stays
                    if n > 1 or c < r.prompt_len:  # this step finished a prefill (even a 1-token chunk)
                        self.kv.share_prefill(r)
                    continue
            elif s:  # ended (abort, EOS) while this step was in flight: drop the token
                next(toks)
                r.device_len -= 1
                r.cached_len = min(r.cached_len, r.device_len)  # no KV beyond the known tokens
            if r.row >= 0 and not r.inflight:  # terminal here: its KV goes once no step uses it
                self.kv.release(r)
        if self.ending:
            self.ending = [r for r in self.ending if r.row >= 0]
        return ended

    def finish(self, r: Request, reason: str, now: float) -> None:
        """A running request has its last token ("length") or an EOS: out of the queue, ended."""
        self.running.remove(r)
        self.end(r, RequestState.FINISHED, reason, now)

    def end(self, r: Request, state: RequestState, reason: str, now: float) -> None:
        """Make r terminal (already out of the queues); its KV goes now, or when the last
        step in flight that uses it completes."""
        r.state = state
        r.finish_reason = reason
        r.finish_time = now
        self.done.append(r)
        if r.row >= 0:
            if r.inflight:
                self.ending.append(r)
            else:
                self.kv.release(r)
