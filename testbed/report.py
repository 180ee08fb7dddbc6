"""`python -m testbed.report DIR`: the table and plots of a run or a sweep.

DIR is one run directory (outputs/<date>/<time>) or a multirun directory (any depth). Prints
a row per job (its varying overrides, throughput, latency percentiles, goodput, prefix hits,
preemptions), writes sweep.parquet / sweep.csv and PNG plots into DIR:

  latency_cdf.png  TTFT / TPOT / E2E CDFs, a line per job
  load.png         latency and goodput against load, a line per policy (sweeps over a load knob)
  gantt.png        a dozen neighbouring requests of one job: queued, prefill, decode
  kv.png           that job's KV pool, batch mix and queue lengths over time

Jobs that cannot be read are named and skipped. SLOs given here (--slo-ttft-ms / --slo-tpot-ms /
--slo-e2e-ms) recompute goodput for every job, whatever the runs were started with."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

LOAD_KEYS = ("trace.rate", "trace.time_scale", "offered_rate")
TABLE = [  # (column, header, format)
    ("completed", "done", "{:.0f}"), ("request_throughput", "req/s", "{:.2f}"),
    ("output_throughput", "out tok/s", "{:,.0f}"), ("median_ttft_ms", "TTFT p50", "{:,.1f}"),
    ("p99_ttft_ms", "TTFT p99", "{:,.1f}"), ("median_tpot_ms", "TPOT p50", "{:.2f}"),
    ("p99_tpot_ms", "TPOT p99", "{:.2f}"), ("p99_e2e_latency_ms", "E2E p99", "{:,.0f}"),
    ("mean_queue_ms", "queue mean", "{:,.1f}"), ("goodput", "goodput", "{:.2f}"),
    ("slo_attainment", "SLO", "{:.1%}"), ("prefix_cache_hit_rate", "hits", "{:.1%}"),
    ("preemptions", "preempt", "{:.0f}"),
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m testbed.report", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", help="a run directory or a multirun (sweep) directory")
    p.add_argument("--slo-ttft-ms", type=float, default=None, help="TTFT SLO for goodput (ms)")
    p.add_argument("--slo-tpot-ms", type=float, default=None, help="TPOT SLO for goodput (ms)")
    p.add_argument("--slo-e2e-ms", type=float, default=None, help="end-to-end latency SLO for goodput (ms)")
    p.add_argument("--x", default=None, help="load axis of load.png (default: trace.rate, trace.time_scale, "
                                             "else the measured offered rate)")
    p.add_argument("--by", default=None, help="line per value of this key in load.png (default: the other "
                                              "varying keys)")
    p.add_argument("--job", default=None, help="job drawn in gantt.png and kv.png (default: highest p99 TTFT)")
    p.add_argument("--no-plots", action="store_true", help="print and write sweep.parquet only")
    p.add_argument("--include-partial", action="store_true", help="keep runs marked complete: false")
    return p.parse_args(argv)


def format_table(summaries, keys: list[str]) -> str:
    import pandas as pd
    cols = [c for c, _, _ in TABLE if c in summaries and summaries[c].notna().any()]
    out = pd.DataFrame(index=summaries.index)
    for k in keys:
        out[k.split(".")[-1] if k.split(".")[-1] not in out else k] = summaries[k].map(_fmt)
    if not keys:
        out["job"] = summaries["job"]
    for c, head, fmt in TABLE:
        if c in cols:
            out[head] = summaries[c].map(lambda v, f=fmt: "-" if v is None or v != v else f.format(v))
    return out.to_string(index=False)


def _fmt(v) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


GOODPUT = ["request_goodput", "goodput", "slo_attainment"]


def with_slo(results, slo):
    """Recompute goodput / SLO attainment per job for the given SLOs (an SLOConfig)."""
    from analysis.metrics import summarize_groups
    g = summarize_groups(results.requests, None, "job", slo.ttft_ms, slo.tpot_ms, slo.e2e_ms)[["job", *GOODPUT]]
    s = results.summaries.drop(columns=GOODPUT, errors="ignore")
    return s.merge(g, on="job", how="left")


def choose_x(summaries, varying: list[str], x: str | None) -> str | None:
    if x:
        return x
    for k in LOAD_KEYS:
        if k in varying:
            return k
    numeric = [k for k in varying if summaries[k].map(lambda v: isinstance(v, (int, float))).all()]
    return numeric[0] if numeric else None


def plots(results, summaries, args, out: Path) -> list[Path]:
    from analysis import plots as P
    from analysis.load import job_labels, load
    from analysis.metrics import require_columns
    for flag, col in (("--x", args.x), ("--by", args.by)):  # columns the command line names
        require_columns(summaries, flag, (col or None,))
    written = []
    varying = results.varying()
    labels = job_labels(summaries, varying)
    reqs = results.requests
    slo = ", ".join(f"{name} <= {v:g} ms" for name, v in (("TTFT", args.slo_ttft_ms), ("TPOT", args.slo_tpot_ms),
                                                          ("E2E", args.slo_e2e_ms)) if v)
    x = choose_x(summaries, varying, args.x)
    if len(varying) == 2 and x in varying:  # colour per the other key, dashes per load
        by, style = [k for k in varying if k != x], x
    else:
        by, style = (varying or ["job"]), None
    written.append(P.save(P.latency_cdfs(reqs, by=by, style=style, title=f"latency CDFs: {results.root.name}"),
                          out / "latency_cdf.png"))
    if x is not None and summaries[x].nunique() > 1:
        by = [args.by] if args.by else [k for k in varying if k != x]
        fig = P.load_curves(summaries, x=x, by=by or "backend",
                            title="latency and goodput against load" + (f" (SLO {slo})" if slo else ""))
        written.append(P.save(fig, out / "load.png"))
    job = args.job
    if job is None:
        job = summaries.sort_values("p99_ttft_ms", ascending=False, na_position="last")["job"].iloc[0]
    label = labels[summaries["job"] == job].iloc[0]
    one = results.job(job)
    path = Path(summaries.loc[summaries["job"] == job, "path"].iloc[0])
    steps = load(path, requests=False, steps=True, include_partial=True, warn=False).steps
    written.append(P.save(P.gantt(one.requests, title=f"request timelines: {label}", steps=steps),
                          out / "gantt.png"))
    if len(steps):
        written.append(P.save(P.kv_timeline(steps, title=f"KV cache and batches over time: {label}"),
                              out / "kv.png"))
    else:  # every request rejected, say: no KV over time to draw
        say(f"kv.png not drawn: job {job} ran no steps")
    return written


def say(text: str) -> None:
    """Print, unless the reader has gone (`... | head`): the files are written all the same."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # later prints go nowhere


def main(argv=None) -> int:
    args = parse_args(argv)
    from analysis.load import LoadError, load
    from testbed.config import SLOConfig, is_slo_ms
    slo = SLOConfig(args.slo_ttft_ms, args.slo_tpot_ms, args.slo_e2e_ms)
    for flag, v in (("--slo-ttft-ms", slo.ttft_ms), ("--slo-tpot-ms", slo.tpot_ms), ("--slo-e2e-ms", slo.e2e_ms)):
        if v is not None and not is_slo_ms(v):
            print(f"error: {flag} {v:g} is invalid; an SLO is a number of milliseconds > 0", file=sys.stderr)
            return 2
    from testbed.sweep import write_table
    try:
        results = load(args.dir, requests=True, steps=False, include_partial=args.include_partial, warn=False)
    except (LoadError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.dir)
    summaries = results.summaries
    if args.job is not None and args.job not in set(summaries["job"]):
        print(f"error: --job {args.job}: no such job; jobs: {', '.join(summaries['job'])}", file=sys.stderr)
        return 2
    if slo.given():
        summaries = with_slo(results, slo)
    for s in results.skipped:
        say(f"skipped {s}")
    keys = results.varying() or [k for k in results.keys if k in summaries and k not in ("backend", "model",
                                                                                           "hardware", "cache")]
    say(f"{len(summaries)} job{'s' if len(summaries) != 1 else ''} in {out}"
        + (f" ({len(results.skipped)} skipped)" if results.skipped else ""))
    say(format_table(summaries, keys))
    written = []
    try:
        written.append(write_table(summaries, out))
        if not args.no_plots:
            written += plots(results, summaries, args, out)
    except ImportError as e:  # the light install has no matplotlib
        print(f"error: the plots need {e.name or 'matplotlib'} (pip install 'testbed[analysis]'), or pass "
              f"--no-plots; written: {', '.join(p.name for p in written)} in {out}", file=sys.stderr)
        return 2
    except (ValueError, KeyError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    say("written: " + ", ".join(str(p.name) for p in written) + f" in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
