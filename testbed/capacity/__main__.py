"""`python -m testbed.capacity [the overrides of testbed.run] slo.ttft_ms=... [slo.tpot_ms=...]
[slo.e2e_ms=...] [capacity.policies=[prefill_first,chunked]] [capacity.target=0.9]
[capacity.low=0.25] [capacity.high=64] [capacity.iterations=8] [capacity.out=DIR]`

For each policy, the highest request rate (trace.rate) at which the share of requests meeting
every SLO given stays at or above capacity.target, in the simulator: low and high are tried
first, then up to `iterations` bisection steps on log(rate). Writes into capacity.out (default
outputs/capacity/<date>/<time>/): a run directory per rate tried, capacity.parquet / .csv (the
rates tried, their attainment and goodput), capacity.json (the settings and each policy's
answer) and capacity.png (goodput and attainment against rate; needs matplotlib)."""
from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from testbed.capacity.settings import CapacityError, split_argv

TABLE = [("policy", "policy", "{}"), ("rate", "rate req/s", "{:g}"), ("role", "tried as", "{}"),
         ("slo_attainment", "SLO attained", "{:.1%}"), ("meets", "meets", "{}"),
         ("request_goodput", "goodput req/s", "{:.2f}"), ("request_throughput", "req/s", "{:.2f}"),
         ("p99_ttft_ms", "TTFT p99", "{:,.1f}"), ("p99_tpot_ms", "TPOT p99", "{:.2f}")]


def configure(argv: list[str]):
    """(capacity settings, run overrides, the composed config of the first policy, the policies):
    every check that can fail before a run, each a one-line CapacityError."""
    from testbed.assemble import model_spec, trace_for
    from testbed.config import ConfigError, compose
    from testbed.run import precheck
    settings, overrides = split_argv(argv)
    if any(a.startswith("-") for a in overrides):
        raise CapacityError(f"{next(a for a in overrides if a.startswith('-'))}: testbed.capacity takes overrides "
                            f"only (the search itself is the sweep); --help says what it takes")
    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides]
    if "trace.rate" in keys:
        raise CapacityError("trace.rate is what testbed.capacity searches; give its range as capacity.low= "
                            "and capacity.high=")
    if "policy" in keys and settings.policies:
        raise CapacityError("give the policies either as capacity.policies=[...] or as policy=NAME, not both")
    for run in [[*overrides, f"policy={p}"] for p in settings.policies] or [overrides]:
        bad = precheck(run)  # each policy's runs compose (a bad name or key: one line)
        if bad:
            raise CapacityError(bad)
    try:
        cfg = compose(overrides)
        policies = settings.policies or [cfg.policy.name]
        for p in policies:  # and pass the checks as its runs will
            compose([*overrides, f"policy={p}"])
    except ConfigError as e:
        raise CapacityError(str(e)) from None
    if cfg.backend.name != "sim":
        raise CapacityError(f"backend={cfg.backend.name}: testbed.capacity searches in the simulator "
                            f"(backend=sim); check its answer with one testbed.run on the engine")
    if not cfg.slo.given():
        raise CapacityError("testbed.capacity needs an SLO to attain: slo.ttft_ms=, slo.tpot_ms= and/or slo.e2e_ms=")
    trace = trace_for(cfg, model_spec(cfg))
    if not trace.synthesized_arrivals:
        raise CapacityError(f"trace={cfg.trace.name} has its own arrival times, so trace.rate does not change its "
                            f"load; use a trace whose arrivals are drawn at trace.rate (sharegpt, arxiv, bwb, "
                            f"synthetic, or a file without arrival_s)")
    return settings, overrides, cfg, policies


def describe(settings, cfg) -> str:
    slo = ", ".join(f"{name} <= {v:g} ms" for name, v in (("TTFT", cfg.slo.ttft_ms), ("TPOT", cfg.slo.tpot_ms),
                                                          ("E2E", cfg.slo.e2e_ms)) if v is not None)
    n = cfg.trace.num_requests
    return (f"search: trace.rate in [{settings.low:g}, {settings.high:g}] req/s, bisection on log(rate), at most "
            f"{settings.iterations} steps after the two ends; target: {settings.target:.0%} of requests within "
            f"{slo}; trace {cfg.trace.name}, {n if n else 'every'} requests a run, simulator")


def answer_line(policy: str, answer, rows, target: float) -> str:
    at = {r["rate"]: r for r in rows if r["policy"] == policy}
    if answer.status == "below_low":
        return (f"{policy}: even the lowest rate, {answer.above:g} req/s, misses: "
                f"{at[answer.above]['slo_attainment']:.1%} attained < {target:.0%}; lower capacity.low")
    if answer.status == "at_high":
        return (f"{policy}: the highest rate, {answer.rate:g} req/s, still meets: "
                f"{at[answer.rate]['slo_attainment']:.1%} attained; capacity >= {answer.rate:g} req/s, "
                f"raise capacity.high")
    return (f"{policy}: capacity {answer.rate:g} req/s ({at[answer.rate]['slo_attainment']:.1%} attained, "
            f"goodput {at[answer.rate]['request_goodput']:.2f} req/s); {answer.above:g} req/s, the next rate "
            f"tried above, attains {at[answer.above]['slo_attainment']:.1%}")


def format_table(df) -> str:
    import pandas as pd
    out = pd.DataFrame({head: df[col].map(lambda v, f=fmt: "-" if v is None or v != v else f.format(v))
                        for col, head, fmt in TABLE})
    return out.to_string(index=False)


def main(argv: list[str]) -> int:
    if {"--help", "-h"} & set(argv):
        print(__doc__)
        return 0
    import pandas as pd

    from testbed.capacity.search import bisect
    from testbed.capacity.trials import Trials
    try:
        settings, overrides, cfg, policies = configure(argv)
        out = Path(settings.out_dir())
        if out.exists() and any(out.iterdir()):  # a search's run directories are named by their order
            raise CapacityError(f"{out} is not empty; give this search its own capacity.out=")
    except (CapacityError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    what = describe(settings, cfg)
    print(what, flush=True)
    trials, answers = Trials(overrides, out), {}
    try:
        for policy in policies:
            def measure(rate, role, policy=policy):
                row = trials.run(policy, rate, role, settings.target)
                print(f"  {policy} at {rate:g} req/s ({role}): {row['slo_attainment']:.1%} attained, goodput "
                      f"{row['request_goodput']:.2f} req/s, {'meets' if row['meets'] else 'misses'}", flush=True)
                return row["slo_attainment"]
            answers[policy] = bisect(measure, settings.low, settings.high, settings.iterations, settings.target)
    except KeyboardInterrupt:
        print(f"interrupted: the runs done are in {out}", file=sys.stderr)
        return 130
    except (RuntimeError, ValueError) as e:  # a run that stopped early: its files say why
        print(f"error: {e}", file=sys.stderr)
        return 1
    df = pd.DataFrame(trials.rows)
    df.to_parquet(out / "capacity.parquet")
    df.to_csv(out / "capacity.csv", index=False)
    lines = [answer_line(p, a, trials.rows, settings.target) for p, a in answers.items()]
    (out / "capacity.json").write_text(json.dumps({
        "search": what, "settings": {**asdict(settings), "out": str(out), "policies": policies},
        "overrides": overrides, "slo": asdict(cfg.slo),
        "answers": {p: {**asdict(a), "line": line} for (p, a), line in zip(answers.items(), lines)},
    }, indent=2) + "\n")
    print(format_table(df))
    print("\n".join(lines))
    written = ["capacity.parquet", "capacity.csv", "capacity.json"]
    try:
        from testbed.capacity.plot import plot
        plot(df, {p: asdict(a) for p, a in answers.items()}, settings.target, what.split("; ", 1)[1],
             out / "capacity.png")
        written.append("capacity.png")
    except ImportError as e:
        print(f"note: capacity.png needs {e.name or 'matplotlib'} (pip install 'testbed[analysis]'); "
              f"the table is written", file=sys.stderr)
    print(f"written: {', '.join(written)} and a run directory per rate in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
