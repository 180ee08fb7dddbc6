"""Scheduler cost: is one scheduler step cheap enough to drive a GPU and a fast simulator?

(a) step: one `chunked` step (schedule() + complete()) with 256 running requests, all
    decoding, and 1,000 waiting requests; prompts 1k-4k tokens, page size 1, a radix cache
    holding ~100k tokens of shared-prefix sequences so that the admission's prefix match
    does real work (waiting prompts are token ids drawn from those prefixes; the running
    ones are lengths only, so their private KV does not grow the tree). Two variants:
      - `admit`: scheduler.max_running=512, so each step decodes the 256 and admits (a 256-token chunk
        of) a waiting request whose prompt matches in the tree: the full step;
      - `default`: the default limits (scheduler.max_running=256): the 256 decodes only, no admission.
    Measured two ways: `fresh` (every repetition on a deep copy of the same starting state)
    and `steady` (consecutive steps; running grows by about one request per 10 steps).
(b) match: a radix match (and a peek, what policies call) of a 4,096-token prompt that
    shares ~3.3k tokens with a conversation cached in a ~100k-token tree of many sequences
    sharing system prompts.

Targets: step <= 300 us, match <= 100 us. Writes benchmarks/results/scheduler.json.

    python benchmarks/bench_scheduler.py [--reps 200] [--profile]
"""
from __future__ import annotations

import argparse
import copy
import cProfile
import datetime
import gc
import io
import json
import os
import platform
import pstats
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from policies import eviction_key, make_policy, policy_config  # noqa: E402
from testbed.core import Request, StepResult  # noqa: E402
from testbed.kv import RadixCache  # noqa: E402
from testbed.scheduler import Scheduler, SchedulerConfig, SchedulerLimits  # noqa: E402
from testbed.scheduler import scheduler as scheduler_module  # noqa: E402

VOCAB = 32_000
TARGET_STEP_US = 300
TARGET_MATCH_US = 100


# ---- a realistic shared-prefix corpus ---------------------------------------------------------
class Corpus:
    """System prompts (shared by many requests) and multi-turn conversations on top of them."""

    def __init__(self, rng: np.random.Generator, n_system=40, n_conv=60, turns=(2, 6)):
        self.rng = rng
        self.system = [self.tokens(int(rng.integers(256, 2048))) for _ in range(n_system)]
        # each conversation: a system prompt, then turns of 100-600 tokens; every prefix ending
        # at a turn is a sequence some request sent (so the tree gets a chain of nodes)
        self.conversations = []
        for _ in range(n_conv):
            seq = self.system[int(rng.integers(n_system))]
            prefixes = []
            for _ in range(int(rng.integers(*turns))):
                seq = np.concatenate([seq, self.tokens(int(rng.integers(100, 600)))])
                prefixes.append(seq)
            self.conversations.append(prefixes)

    def tokens(self, n: int) -> np.ndarray:
        return self.rng.integers(0, VOCAB, n, dtype=np.int32)

    def cached_sequences(self):
        for conv in self.conversations:
            yield from conv

    def prompt(self, length: int) -> np.ndarray:
        """A new prompt of `length` tokens: a cached system prompt or conversation prefix, then new text."""
        if self.rng.random() < 0.5:
            base = self.system[int(self.rng.integers(len(self.system)))]
        else:
            conv = self.conversations[int(self.rng.integers(len(self.conversations)))]
            base = conv[int(self.rng.integers(len(conv)))]
        base = base[: max(0, length - 64)]
        return np.concatenate([base, self.tokens(length - len(base))])


def fill_cache(cache: RadixCache, allocator, seqs) -> int:
    """Insert sequences as if requests had finished with them: the tree takes the pages it
    did not have, the rest go back to the allocator. Returns the tokens cached."""
    for s in seqs:
        pages = allocator.alloc(len(s))
        held = cache.insert(s, pages)
        allocator.free(pages[:held])
    return cache.cached_pages * cache.page_size


def tree_stats(cache: RadixCache) -> dict:
    nodes = list(cache.nodes())
    return {"tokens": cache.cached_pages * cache.page_size, "nodes": len(nodes),
            "leaves": sum(1 for n in nodes if not n.children)}


# ---- (a) the step ---------------------------------------------------------------------------------
def build_state(max_running: int, seed: int = 0, n_running=256, n_waiting=1000) -> tuple[Scheduler, dict]:
    rng = np.random.default_rng(seed)
    corpus = Corpus(rng)
    prompts = rng.integers(1024, 4097, n_running + n_waiting)
    pol = make_policy(policy_config("chunked"))
    # enough KV for everyone's whole life, plus the cache: nothing is evicted or preempted
    num_pages = int((prompts[:n_running] + 2048).sum()) + 400_000
    s = Scheduler(SchedulerConfig(num_pages=num_pages, page_size=1, max_context=8192,
                                  limits=SchedulerLimits(max_running=max_running)), pol, eviction_key("lru"))
    fill_cache(s.cache, s.allocator, corpus.cached_sequences())
    # the running requests: lengths only (as a trace gives them), so their KV stays private and
    # the tree keeps its ~100k tokens; prefill them in one big warm-up step
    running = [Request(rid=i, prompt_len=int(prompts[i]), max_new_tokens=int(rng.integers(1024, 2048)))
               for i in range(n_running)]
    for r in running:
        s.add_request(r, 0.0)
    budget, limit = pol.cfg.token_budget, s.cfg.limits.max_step_tokens
    pol.cfg.token_budget = s.cfg.limits.max_step_tokens = 10**8  # warm-up only: admit and prefill all at once
    t = 0.0
    while any(r.cached_len < r.prompt_len for r in running) or not all(r.output_ids for r in running):
        _step(s, t)
        t += 0.01
    pol.cfg.token_budget, s.cfg.limits.max_step_tokens = budget, limit
    for _ in range(3):  # a few plain decode steps
        _step(s, t)
        t += 0.01
    for j in range(n_waiting):
        i = n_running + j
        s.add_request(Request(rid=i, prompt_len=int(prompts[i]), max_new_tokens=int(rng.integers(64, 1024)),
                              arrival=t, prompt_ids=corpus.prompt(int(prompts[i]))), t)
    assert len(s.running) == n_running and len(s.waiting) == n_waiting
    assert all(r.extend_len == 1 for r in s.running)
    s.check_integrity()
    info = {"running": len(s.running), "waiting": len(s.waiting), "num_pages": num_pages,
            "tree": tree_stats(s.cache), "t": t}
    return s, info


def _tokens(plan) -> np.ndarray:
    return np.array([r.rid * 7 + r.device_len for r, smp in zip(plan.reqs, plan.samples) if smp], dtype=np.int64)


def _step(s: Scheduler, t: float):
    plan = s.schedule(t)
    s.complete(plan, StepResult(0.01, _tokens(plan)), t + 0.01)
    return plan


def timed_step(s: Scheduler, t: float) -> tuple[float, object]:
    """Microseconds of schedule() + complete(); the executor's token array is made outside."""
    t0 = time.perf_counter_ns()
    plan = s.schedule(t)
    t1 = time.perf_counter_ns()
    toks = _tokens(plan)
    t2 = time.perf_counter_ns()
    s.complete(plan, StepResult(0.01, toks), t + 0.01)
    t3 = time.perf_counter_ns()
    return ((t1 - t0) + (t3 - t2)) / 1e3, plan


def stats(us: list[float]) -> dict:
    a = np.asarray(us)
    return {"median_us": round(float(np.median(a)), 1), "p90_us": round(float(np.percentile(a, 90)), 1),
            "min_us": round(float(a.min()), 1), "mean_us": round(float(a.mean()), 1), "n": len(us)}


def bench_step(max_running: int, reps: int, steady_steps: int) -> dict:
    base, info = build_state(max_running)
    t0 = info.pop("t")
    fresh, shapes = [], set()
    for _ in range(reps):
        s = copy.deepcopy(base)
        gc.collect()
        us, plan = timed_step(s, t0)
        fresh.append(us)
        shapes.add((len(plan), plan.total_tokens, s.stats_of(plan).admitted))
    s = copy.deepcopy(base)
    gc.collect()
    steady, admitted = [], 0
    t = t0
    for _ in range(steady_steps):
        us, plan = timed_step(s, t)
        steady.append(us)
        admitted += s.stats_of(plan).admitted
        t += 0.01
    s.check_integrity()
    (items, tokens, adm), = shapes  # every fresh repetition plans the same step
    return {"state": info, "step_items": items, "step_tokens": tokens, "admitted_per_step": adm,
            "fresh": stats(fresh),
            "steady": {**stats(steady), "admitted": admitted, "running_at_start": info["running"],
                       "running_at_end": len(s.running), "waiting_at_end": len(s.waiting)}}


def breakdown(max_running: int, steps: int) -> dict:
    """Median microseconds per step of each phase (wrappers on one instance; the rest of
    schedule() is what is left of the total)."""
    base, info = build_state(max_running)
    s, t = copy.deepcopy(base), info["t"]
    spent: dict[str, list] = {}

    restore = []

    def wrap(obj, name, label):
        fn = getattr(obj, name)
        restore.append((obj, name, fn))

        def timed(*a, **k):
            t0 = time.perf_counter_ns()
            try:
                return fn(*a, **k)
            finally:
                spent.setdefault(label, []).append((time.perf_counter_ns() - t0) / 1e3)
        setattr(obj, name, timed)

    wrap(s, "view", "view (snapshot of the queues)")
    wrap(s.policy, "make_plan", "policy.make_plan (decodes + admission)")
    wrap(scheduler_module, "validate_plan", "validate_plan (plan checks)")  # a module function: put back below
    wrap(s.prefill, "fit", "prefill.fit (admit, make room, pages, page table)")
    wrap(s.decode, "advance", "decode.advance (ledger)")
    wrap(s, "complete", "complete (tokens, finishes)")
    totals = []
    for _ in range(steps):
        us, _ = timed_step(s, t)
        totals.append(us)
        t += 0.01
    for obj, name, fn in restore:
        setattr(obj, name, fn)
    out = {k: round(float(np.median(v)), 1) for k, v in spent.items()}
    out["total schedule()+complete()"] = round(float(np.median(totals)), 1)
    return out


def profile_steady(max_running: int, steps: int) -> str:
    base, info = build_state(max_running)
    s, t = copy.deepcopy(base), info["t"]
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(steps):
        _step(s, t)
        t += 0.01
    pr.disable()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(25)
    return out.getvalue()


# ---- (b) the match -----------------------------------------------------------------------------------
def bench_match(reps: int) -> dict:
    from testbed.kv import PageAllocator
    rng = np.random.default_rng(1)
    corpus = Corpus(rng, n_system=40, n_conv=60)
    alloc = PageAllocator(400_000, 1)
    cache = RadixCache(1, eviction_key("lru"))
    fill_cache(cache, alloc, corpus.cached_sequences())
    # the prompt: the longest cached conversation prefix, cut to ~80% of 4,096, then new tokens
    longest = max((c[-1] for c in corpus.conversations), key=len)
    shared = min(len(longest), 3300)
    prompt = np.concatenate([longest[:shared], corpus.tokens(4096 - shared)])
    node, hit, _ = cache.match(prompt)  # the first match may split an edge; time the steady ones
    depth = 0
    while node is not cache.root:
        depth += 1
        node = node.parent
    out = {"tree": tree_stats(cache), "prompt_tokens": len(prompt), "hit_tokens": int(hit), "path_nodes": depth}
    miss = corpus.tokens(4096)
    while cache.peek(miss):  # a prompt sharing nothing
        miss = corpus.tokens(4096)
    for name, fn in (("match", lambda: cache.match(prompt)), ("peek", lambda: cache.peek(prompt)),
                     ("miss", lambda: cache.match(miss))):
        us = []
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            fn()
            us.append((time.perf_counter_ns() - t0) / 1e3)
        out[name] = stats(us)
    return out


# ---- main ---------------------------------------------------------------------------------------------
def machine() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        rev = None
    try:
        load = Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        load = None
    return {"python": platform.python_version(), "cpus": os.cpu_count(), "loadavg_at_start": load, "implementation": platform.python_implementation(),
            "numpy": np.__version__, "cpu": cpu, "platform": platform.platform(), "git_revision": rev}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=200, help="fresh-state repetitions of the step")
    ap.add_argument("--steady-steps", type=int, default=150,
                    help="consecutive steps (`admit` grows running by ~1 per 6 steps, so keep this short)")
    ap.add_argument("--match-reps", type=int, default=2000)
    ap.add_argument("--profile", action="store_true", help="also cProfile steady steps of the `admit` variant")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "scheduler.json"))
    args = ap.parse_args(argv)

    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join([Path(sys.executable).name, *sys.argv]), "machine": machine(),
              "targets_us": {"step": TARGET_STEP_US, "match": TARGET_MATCH_US}, "step": {}}
    for variant, max_running in (("admit", 512), ("default", 256)):
        result["step"][variant] = {"max_running": max_running, **bench_step(max_running, args.reps, args.steady_steps)}
    result["match"] = bench_match(args.match_reps)
    a = result["step"]["admit"]
    result["verdict"] = {"step_ok": a["fresh"]["median_us"] <= TARGET_STEP_US,
                         "match_ok": result["match"]["match"]["median_us"] <= TARGET_MATCH_US}
    result["breakdown_admit_steady_us"] = breakdown(512, args.steady_steps)
    if args.profile:
        result["profile_admit_steady"] = profile_steady(512, args.steady_steps)

    print(f"scheduler benchmark  ({result['machine']['cpu']}, Python {result['machine']['python']})")
    print(f"{'what':42s} {'median us':>10s} {'p90 us':>10s} {'target':>8s}")
    for variant in ("admit", "default"):
        v = result["step"][variant]
        for how in ("fresh", "steady"):
            label = (f"chunked step, {variant} ({v['step_items']} items/{v['step_tokens']} tok), {how}")
            print(f"{label:42s} {v[how]['median_us']:10.1f} {v[how]['p90_us']:10.1f} {TARGET_STEP_US:8d}")
    m = result["match"]
    for name in ("match", "peek", "miss"):
        label = f"radix {name} 4096 tok vs {m['tree']['tokens'] // 1000}k cached (hit {m['hit_tokens'] if name != 'miss' else 0})"
        print(f"{label:42s} {m[name]['median_us']:10.1f} {m[name]['p90_us']:10.1f} {TARGET_MATCH_US:8d}")
    print(f"tree for the step: {a['state']['tree']}; for the match: {m['tree']}, path {m['path_nodes']} nodes")
    print("where a steady `admit` step goes (median us per phase):")
    for k, v in result["breakdown_admit_steady_us"].items():
        print(f"  {k:44s} {v:8.1f}")
    if args.profile:
        print(result["profile_admit_steady"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
