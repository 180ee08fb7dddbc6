"""The serving layer's own cost: one trace at several request rates, run in-process
(`backend=engine`, the engine loaded once) and replayed over HTTP (`backend=http`) against
`python -m testbed.serve` with the same model and engine settings; TTFT, ITL, TPOT, E2E and
throughput side by side, and per request the client's TTFT / E2E over the server's own
(the server's requests.parquet, written when it is stopped; matched by response id). Each
rate gets a fresh server, as each in-process run starts with an empty prefix cache.

    python benchmarks/serve_vs_engine.py --rates 6,13,25 --seconds 15 --out DIR -- \
        model=qwen3_0_6b model.weights=dummy serve.tokenizer=TOKDIR [policy=...] [engine.*=...]

Each rate's run has rate x --seconds requests (--requests N: that many at every rate);
--rates trace uses the trace's own arrival times. serve.* overrides go to the server only, backend.*
(backend.timeout_s=...) to the replay only. The two sides run one after the other, never
at once (they would share the device). Writes DIR/serve_vs_engine.json and a table; every run's
files stay under DIR. Exits 1 when a run fails, or a replay has errors or unfinished requests or finishes another
number than the in-process run.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from testbed.serve.server_process import ServerError, ServerProcess, child_env

ROOT = Path(__file__).resolve().parents[1]
METRICS = ("output_throughput", "request_throughput", "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms",
           "mean_itl_ms", "median_itl_ms", "p90_itl_ms", "mean_tpot_ms", "median_tpot_ms", "mean_e2el_ms",
           "median_e2el_ms", "p90_e2el_ms")
SERVER_START_S = 900  # model load and the engine's warm-up of every step kind
SERVER_ONLY = ("serve.",)  # overrides the in-process run does not take
CLIENT_ONLY = ("backend.",)  # the replay's own (backend.timeout_s=...): neither engine side takes them


def without(overrides: list[str], prefixes: tuple[str, ...]) -> list[str]:
    """The overrides one side takes: those of the other sides' prefixes left out."""
    return [o for o in overrides if not o.startswith(prefixes)]


def trace_overrides(rate: str, n: int) -> list[str]:
    return [f"trace.num_requests={n}"] + ([] if rate == "trace" else [f"trace.rate={rate}"])


def run_in_process(overrides: list[str], plan: list[tuple[str, int]], out: Path) -> dict:
    """Every rate on one model load, as the fidelity experiment's engine side does."""
    import torch

    from testbed import assemble
    from testbed.config import compose
    from testbed.run import run

    own = without(overrides, SERVER_ONLY + CLIENT_ONLY)
    parts, result = None, {}
    try:
        for rate, n in plan:
            cfg = compose(own + ["backend=engine", "progress=false"] + trace_overrides(rate, n))
            parts = parts or assemble.engine_parts(cfg)
            s = run(cfg, str(out / f"engine_{rate}"), engine_parts=parts, keep_ids=False, print_table=False)
            result[rate] = s["metrics"]
            print(f"engine   rate {rate}: {s['metrics']['completed']} of {n} done, "
                  f"{s['metrics']['output_throughput']:.0f} tok/s", flush=True)
    finally:
        parts = None  # the server loads its own engine on the same device next
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return result


def cpu_seconds(pid: int) -> float:
    """A live process's user + system CPU time so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def replay(url: str, overrides: list[str], rate: str, n: int, out: Path, python_args=()) -> dict:
    """python -m testbed.run backend=http, as a user runs it; its summary's metrics."""
    own = without(overrides, SERVER_ONLY)
    d = out / f"http_{rate}"
    p = subprocess.run([sys.executable, *python_args, "-m", "testbed.run", *own, "backend=http", f"backend.url={url}",
                        "progress=false", f"hydra.run.dir={d}", *trace_overrides(rate, n)],
                       cwd=ROOT, env=child_env(), capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"backend=http at rate {rate} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    m = json.loads((d / "summary.json").read_text())["metrics"]
    print(f"http     rate {rate}: {m['completed']} of {n} done, {m['output_throughput']:.0f} tok/s", flush=True)
    return m


def client_over_server(out: Path, rate: str) -> dict:
    """The server's own metrics of the requests the replay sent, the client's TTFT and E2E
    over the server's for each request (ms: HTTP both ways and the detokenizer: the server's own
    times count from its HTTP handler), and the client's
    TTFT split by stage (STAGES), the two runs' clocks lined up by their summaries' origins."""
    import numpy as np
    import pandas as pd

    from testbed.timeline.metrics import summarize

    served = pd.read_parquet(out / f"served_{rate}" / "requests.parquet")
    served["response_id"] = [f"cmpl-{rid}" for rid in served["rid"]]
    client = pd.read_parquet(out / f"http_{rate}" / "requests.parquet")
    client = client[client["response_id"].notna()]  # those the server took (the rest: over the context)
    both = client.merge(served, on="response_id", suffixes=("_client", "_server"), validate="one_to_one")
    if len(both) != len(client) or len(both) != len(served):
        raise SystemExit(f"rate {rate}: the client's {len(client)} requests and the server's {len(served)} "
                         f"match {len(both)} times")
    ttft = (both["ttft_s_client"] - both["ttft_s_server"]).to_numpy() * 1e3
    e2e = (both["e2e_s_client"] - both["e2e_s_server"]).to_numpy() * 1e3
    q = lambda a: {"median": float(np.median(a)), "p90": float(np.quantile(a, 0.9)),  # noqa: E731
                   "min": float(a.min()), "max": float(a.max())}
    origin = {side: json.loads((out / d / "summary.json").read_text())["clock_origin_s"]
              for side, d in (("client", f"http_{rate}"), ("server", f"served_{rate}"))}
    shift = origin["client"] - origin["server"]  # a client time plus this is on the server's clock
    b = {k: both[k].to_numpy(float) for k in ("arrival_s_client", "first_scheduled_s_client", "first_token_s_client",
                                               "arrival_s_server", "tokenized_s_server", "queued_s_server", "first_token_s_server")}
    sent, first = b["first_scheduled_s_client"] + shift, b["first_token_s_client"] + shift
    stages = {"client_late": b["first_scheduled_s_client"] - b["arrival_s_client"],
              "http_in": b["arrival_s_server"] - sent, "tokenizer": b["tokenized_s_server"] - b["arrival_s_server"],
              "to_scheduler": b["queued_s_server"] - b["tokenized_s_server"],
              "engine": b["first_token_s_server"] - b["queued_s_server"], "back_to_client": first - b["first_token_s_server"]}
    return {"server_metrics": summarize(served), "ttft_over_ms": q(ttft), "e2e_over_ms": q(e2e),
            "ttft_stages_ms": {k: q(v * 1e3) for k, v in stages.items()}}


STAGES = ("client_late: the trace's arrival to the client sending it; http_in: sent to the app's handler; "
          "tokenizer: the handler to the ids ready; to_scheduler: to the scheduler taking it; engine: to the "
          "first token's step end; back_to_client: to the client reading it. The server's own TTFT counts from "
          "the handler (its arrival_s): tokenizer + to_scheduler + engine")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", required=True, help="comma-separated req/s, or 'trace' (its own arrivals)")
    ap.add_argument("--seconds", type=float, default=15.0, help="each run's requests: rate x this many seconds")
    ap.add_argument("--requests", type=int, help="that many requests at every rate instead")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--skip-engine", action="store_true", help="the HTTP side only")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile the app's process and the client into DIR/{app,client}_RATE.prof (slows both: "
                         "their latencies then say little)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for both sides (after --)")
    a = ap.parse_args()
    rates = [r.strip() for r in a.rates.split(",") if r.strip()]
    for r in rates:
        if r != "trace" and not (r.replace(".", "", 1).isdigit() and float(r) > 0):
            ap.error(f"--rates: {r!r} is not a positive number or 'trace'")
    if a.requests is None and "trace" in rates:
        ap.error("--rates trace needs --requests N")
    plan = [(r, a.requests or max(1, round(float(r) * a.seconds))) for r in rates]
    a.out.mkdir(parents=True, exist_ok=True)
    engine = {} if a.skip_engine else run_in_process(a.overrides, plan, a.out)

    http, served, cpu_share = {}, {}, {}
    for rate, n in plan:  # a fresh server a rate: its prefix cache holds none of the last rate's prompts
        prof = lambda side: ("-m", "cProfile", "-o", str((a.out / f"{side}_{rate}.prof").resolve())) if a.profile else ()  # noqa: E731
        try:
            server = ServerProcess(without(a.overrides, CLIENT_ONLY), a.out / f"served_{rate}", SERVER_START_S, prof("app"))
        except ServerError as e:
            raise SystemExit(str(e)) from None
        try:
            pids = server.pids()
            before, children, t = {k: cpu_seconds(p) for k, p in pids.items()}, resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
            http[rate] = replay(server.url, a.overrides, rate, n, a.out, prof("client"))
            wall, after = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = {k: cpu_seconds(p) - before[k] for k, p in pids.items()}
            cpu["client"] = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
            cpu_share[rate] = {"replay_wall_s": wall, **{k: v / wall for k, v in cpu.items()}}
        except BaseException:
            server.kill()
            raise
        rc = server.stop(timeout=300)
        if rc != 0:
            raise SystemExit(f"the server exited with {rc} on Ctrl-C; its log: {server.log_path}")
        served[rate] = client_over_server(a.out, rate)

    result = {"overrides": a.overrides, "plan": plan, "engine": engine, "http": http, "served": served,
              "ttft_stages": STAGES, "cpu_share": cpu_share,
              "cpu_share_is": "each process's CPU seconds over the replay's wall time (1.0: one core busy throughout)"}
    (a.out / "serve_vs_engine.json").write_text(json.dumps(result, indent=1) + "\n")
    # every request the server took finished, and as many as in-process (the same ones are over the context)
    bad = [r for r, _ in plan if http[r]["errors"] or http[r]["unfinished"]
           or (engine and engine[r]["completed"] != http[r]["completed"])]
    print(f"\n{'rate':>6} {'side':<7} " + " ".join(f"{m.replace('_ms', ''):>15}" for m in METRICS))
    for rate, _ in plan:
        sides = ([("engine", engine[rate])] if engine else []) + [("http", http[rate]),
                                                                   ("server", served[rate]["server_metrics"])]
        for side, m in sides:
            print(f"{rate:>6} {side:<7} " + " ".join(f"{m[k]:>15.2f}" for k in METRICS))
        o = served[rate]
        print(f"{rate:>6} client - server per request, ms: TTFT median {o['ttft_over_ms']['median']:.2f} "
              f"(p90 {o['ttft_over_ms']['p90']:.2f}), E2E median {o['e2e_over_ms']['median']:.2f}")
        print(f"{rate:>6} client TTFT by stage, median (p90) ms: " + ", ".join(
            f"{k} {v['median']:.2f} ({v['p90']:.2f})" for k, v in o["ttft_stages_ms"].items()))
        print(f"{rate:>6} CPU share over the replay: " + ", ".join(
            f"{k} {v:.2f}" for k, v in cpu_share[rate].items() if k != "replay_wall_s"))
    print(f"stages: {STAGES}")
    if bad:
        print(f"rates {bad}: a replay had errors or unfinished requests, or finished other than in-process",
              file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
