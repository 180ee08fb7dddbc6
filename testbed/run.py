"""Entry point: `python -m testbed.run policy=chunked trace=sharegpt` (Hydra overrides).

Replays a trace through the scheduler on the chosen backend and writes requests.parquet,
steps.parquet and summary.json into Hydra's output directory."""
from __future__ import annotations

import contextlib
import datetime
import gc
import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path

import hydra
from omegaconf import OmegaConf

from testbed.config import Config, ConfigError, check, register_schema, to_config

log = logging.getLogger("testbed.run")
CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")

register_schema()


class Terminated(BaseException):
    """SIGTERM arrived (a job scheduler's time limit, `timeout`, `docker stop`): the run stops
    as on Ctrl-C, writes what is done and exits 143."""


class IntegrityError(RuntimeError):
    """The end-of-run KV check failed (a leaked page); the results were written first."""


def _raise_terminated(signum, frame):
    raise Terminated


@contextlib.contextmanager
def _signal_handlers(handlers: dict):
    """`handlers` ({signal: handler}) while the block runs, the old ones after; only in the main
    thread (the only one signals reach, and the only one that may set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, h) for sig, h in handlers.items()}
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


@contextlib.contextmanager
def _signals_wait_for_the_write(act: bool = True):
    """SIGINT / SIGTERM during the write are held until the run's files are written, then acted
    on (act=False: only noted in the list it yields, for the caller to act on)."""
    held: list[int] = []

    def hold(signum, frame):
        held.append(signum)
    with _signal_handlers({signal.SIGINT: hold, signal.SIGTERM: hold}):
        yield held
    if act and held:
        raise _stop_for(held)


def _stop_for(held: list[int]) -> type[BaseException]:
    """What held signals stop the run with: SIGTERM's Terminated before Ctrl-C's KeyboardInterrupt."""
    return Terminated if signal.SIGTERM in held else KeyboardInterrupt


def run(cfg: Config, out_dir: str, engine_parts=None, keep_ids: bool | None = None, print_table: bool = True) -> dict:
    """Run one configuration; returns the summary. Ctrl-C writes what is done, marked incomplete.
    engine_parts: a model already built for this config's engine settings (testbed.assemble.
    engine_parts), shared by several runs. keep_ids: write the engine's output ids (default: on
    the engine). The run directory is locked while the run runs; one that another run holds or
    that holds a run already is refused (testbed/timeline/rundir.py)."""
    from testbed.timeline.rundir import claim_run_dir

    check(cfg)
    lock = claim_run_dir(out_dir)
    try:
        return _run(cfg, out_dir, engine_parts, keep_ids, print_table)
    finally:
        lock.close()


def _run(cfg: Config, out_dir: str, engine_parts, keep_ids, print_table) -> dict:
    from testbed import assemble
    if cfg.backend.name == "http":
        if engine_parts is not None:
            raise ValueError("engine parts are for backend=engine")
        return drive_client(cfg, out_dir, assemble.build_client_run(cfg), print_table)
    return drive(cfg, out_dir, assemble.build_run(cfg, engine_parts), keep_ids, print_table)


def drive(cfg: Config, out_dir: str, built, keep_ids=None, print_table: bool = True) -> dict:
    """Run a built run (testbed.assemble.Run) to its end and write what was done: a trace's
    replay, or a server's engine (its Run has no trace, and its requests grow as they arrive)."""
    from testbed.timeline.records import request_row
    from testbed.timeline.request_rows import RequestRows
    trace, requests, sched, driver, info = built.trace, built.requests, built.scheduler, built.driver, built.info
    keep_ids = False if cfg.backend.name == "sim" else (True if keep_ids is None else keep_ids)
    rows = None
    if cfg.backend.name == "sim":  # a replay's finished requests go to the writer as they end (bounded memory)
        rows = RequestRows(keep_ids, request_row)
        driver.stream_rows(rows)
    ran = _drive(cfg, driver, trace, len(requests))
    with _signals_wait_for_the_write():  # a second Ctrl-C from here waits for the files too
        driver.executor.fill_predictions(driver.steps)  # the engine's per-step predictions, out of its timed loop
        integrity = leak = None
        if ran.complete:
            integrity = sched.check_integrity()
            if integrity["in_use"]:  # the results are written first, then the failed check is reported
                leak = f"KV leak after the run: {integrity}"
                ran.complete, ran.error = False, f"integrity check failed: {leak}"
        queued = {id(r) for r in sched.waiting}
        made = getattr(requests, "made", None)  # a trace's requests that never arrived were never made
        arrived = [r for r in (made() if made else requests)
                   if r.state.name != "WAITING" or id(r) in queued]  # not-yet-arrived: left out
        if rows is not None:
            arrived = [r for r in arrived if r.rid not in rows.rids]
        extra = {**ran.fields(cfg, trace, len(requests), len(driver.steps)), "kv": {**info, "integrity": integrity}}
        summary = _write(cfg, out_dir, ran, arrived, driver.steps, extra, keep_ids, request_row, print_table, rows)
    if leak:
        raise IntegrityError(f"{leak}; the results are in {out_dir} (summary.json says which check failed)")
    return _raise_for(ran, out_dir, summary)


def drive_client(cfg: Config, out_dir: str, built, print_table: bool = True) -> dict:
    """backend=http: the client's replay (testbed.assemble.ClientRun) to its end, and its
    requests.parquet and summary.json from the client side (steps.parquet is empty: the server
    has the steps; there is no KV of ours to check)."""
    from testbed.client import client_row
    driver, n = built.driver, len(built.driver.records)
    ran = _drive(cfg, driver, built.trace, n)
    with _signals_wait_for_the_write():
        extra = {**ran.fields(cfg, built.trace, n, None), "server": built.info, "kv": None,
                 "request_errors": _request_errors(driver.arrived)}
        summary = _write(cfg, out_dir, ran, driver.arrived, driver.steps, extra, False, client_row, print_table)
    return _raise_for(ran, out_dir, summary)


def _request_errors(records, most: int = 3) -> list[dict]:
    """The failed requests' errors, the commonest first (a server that is down fails them all
    alike): what the table names beside the count."""
    from collections import Counter
    counts = Counter(r.error for r in records if r.error)
    return [{"error": e, "requests": k} for e, k in counts.most_common(most)]


class _Ran:
    """How a driver's run ended: complete or why not, the signal to raise again once the
    files are written, the wall clock at its start and its length."""

    def __init__(self):
        self.complete, self.error, self.stop = True, None, None
        self.started_at = datetime.datetime.now(datetime.timezone.utc)  # the wall clock at t=0 of the timelines
        self.t0 = time.perf_counter()
        self.wall = 0.0
        self.clock_origin = None  # a wall-clock driver's t=0 as a perf_counter() value

    def fields(self, cfg: Config, trace, n: int, steps: int | None) -> dict:
        """summary.json's account of the run (n requests; steps: None for a client, which has none)."""
        return {"backend": cfg.backend.name,
                "trace": ({"name": trace.name, "notes": trace.notes, "over_context": trace.over_context,
                           "num_requests": n, "rows": trace.rows, "rows_left_out": trace.rows_left_out,
                           "synthesized_arrivals": trace.synthesized_arrivals}
                          if trace is not None else {"name": "served", "num_requests": n}),
                "overrides": _job_overrides(),
                "started_at": self.started_at.isoformat(), "wall_time_s": self.wall,
                # lines up the timelines of a client and a server run on one machine (CLOCK_MONOTONIC)
                "clock_origin_s": self.clock_origin,
                "steps_per_wall_s": steps / self.wall if steps is not None and self.wall else None}


def _job_overrides() -> list[str] | None:
    """The command line's overrides of this run's Hydra job, kept in summary.json: the run's own
    record of them (analysis.load labels runs by them), which a later command refused the same
    directory cannot rewrite as it can .hydra/overrides.yaml. None outside a Hydra job."""
    from hydra.core.hydra_config import HydraConfig
    if not HydraConfig.initialized():
        return None
    return [str(o) for o in HydraConfig.get().overrides.task]


def _drive(cfg: Config, driver, trace, n: int) -> _Ran:
    """driver.run() with a progress bar; Ctrl-C, SIGTERM or an error end it, noted on the result."""
    from testbed.progress import Progress
    for note in trace.notes if trace is not None else ():
        log.info("trace: %s", note)
    # Everything built so far (requests, their token ids, the model) lives for the whole run:
    # take it out of the cyclic GC's view so collections stay short (no multi-ms pauses mid-run).
    gc.collect()
    gc.freeze()
    progress = Progress(n, cfg.progress, label=cfg.backend.name)
    driver.progress = progress
    if trace is not None:
        log.info("running %d requests on %s", n, cfg.backend.name)
    ran = _Ran()
    try:
        with _signal_handlers({signal.SIGTERM: _raise_terminated}):  # SIGTERM stops the run as Ctrl-C does
            driver.run()
    except KeyboardInterrupt:
        ran.complete, ran.error, ran.stop = False, "interrupted (Ctrl-C)", KeyboardInterrupt
    except Terminated:
        ran.complete, ran.error, ran.stop = False, "terminated (SIGTERM)", Terminated
    except Exception as e:  # keep what is done, then report
        ran.complete, ran.error = False, f"{type(e).__name__}: {e}"
    finally:
        with _signals_wait_for_the_write(act=False) as held:  # a second Ctrl-C while the ranks stop
            gc.unfreeze()  # later runs in this process (the fidelity experiment) collect as usual
            progress.close()
            driver.close()  # stops the TP ranks
    if held and ran.stop is None:  # the run's files are written first, then it stops
        ran.stop = _stop_for(held)
    ran.wall = time.perf_counter() - ran.t0
    ran.clock_origin = getattr(driver, "clock_origin", None)
    return ran


def _write(cfg: Config, out_dir: str, ran: _Ran, reqs, steps, extra: dict, keep_ids, row, print_table: bool,
           rows=None) -> dict:
    """The run's files and its table; row, rows: write_run's. Its callers hold the signals
    (_signals_wait_for_the_write) from the run's end until the files are written."""
    from testbed.timeline.writer import WriteError, write_run
    extra = {"complete": ran.complete, "error": ran.error, **extra}  # after the end-of-run check
    unwritten = None
    try:
        summary = write_run(out_dir, reqs, steps, OmegaConf.to_container(OmegaConf.structured(cfg)),
                            extra, keep_ids, cfg.slo, row, rows)
    except WriteError as e:  # the metrics are printed all the same
        summary, unwritten = e.summary, e
    if print_table:
        print_summary(summary, out_dir)
    if unwritten is not None:
        if not ran.error:
            raise unwritten
        print(f"error: {unwritten}", file=sys.stderr)  # beside the stop that is reported below
    if ran.stop is not None:
        raise ran.stop
    return summary


def _raise_for(ran: _Ran, out_dir: str, summary: dict) -> dict:
    if ran.error:
        raise RuntimeError(f"run stopped early ({ran.error}); the finished requests are in {out_dir}")
    return summary


def print_summary(summary: dict, out_dir: str) -> None:
    m = summary["metrics"]

    def f(x, fmt="{:,.1f}"):
        return "-" if x is None else fmt.format(x)
    t = summary.get("trace", {})
    rows = [
        ("trace", f"{t.get('name')}: {t.get('num_requests', 0):,} requests"
                  + (f" of {t['rows']:,} rows ({t['rows_left_out']:,} left out by trace.num_requests)"
                     if t.get("rows_left_out") else "")),
        ("requests", f"{m['completed']} finished, {m['rejected']} rejected, {m['aborted']} aborted, "
                     + (f"{m['errors']} failed (HTTP), " if m.get("errors") else "") + f"{m['unfinished']} unfinished"),
        ("duration", f(m["duration_s"], "{:,.2f} s") + (" (simulated)" if summary["backend"] == "sim" else "")),
        ("throughput", f"{f(m['request_throughput'], '{:.2f}')} req/s, "
                       f"{f(m['output_throughput'])} output tok/s, {f(m['total_token_throughput'])} tok/s"),
        ("TTFT ms", f"mean {f(m['mean_ttft_ms'])}  median {f(m['median_ttft_ms'])}  p99 {f(m['p99_ttft_ms'])}"),
        ("TPOT ms", f"mean {f(m['mean_tpot_ms'])}  median {f(m['median_tpot_ms'])}  p99 {f(m['p99_tpot_ms'])}"),
        ("ITL ms", f"mean {f(m['mean_itl_ms'])}  p99 {f(m['p99_itl_ms'])}"),
        ("E2E ms", f"mean {f(m['mean_e2e_latency_ms'])}  p99 {f(m['p99_e2e_latency_ms'])}"),
        ("prefix hits", f"{f(m['prefix_cache_hit_rate'], '{:.1%}')} of prompt tokens; {f(m['preemptions'], '{}')} "
                        "preemptions" + (" (the server's; not seen by a client)" if m['preemptions'] is None else "")),
        ("wall time", f"{summary['wall_time_s']:.2f} s, {f(summary['steps_per_wall_s'], '{:,.0f}')} steps/s"),
    ]
    for e in summary.get("request_errors") or ():  # backend=http's failed requests, the commonest errors
        rows.append(("error", f"{e['requests']} x {e['error']}"))
    if "goodput" in m:
        rows.append(("goodput", f"{m['goodput']:.2f} req/s within SLO ({m['slo_attainment']:.1%} attained)"))
    if not summary["complete"]:
        rows.insert(0, ("INCOMPLETE", summary["error"]))
    width = max(len(k) for k, _ in rows)
    missing = set(summary.get("unwritten_files", []))
    files = [f for f in ("requests.parquet", "steps.parquet", "summary.json") if f not in missing]
    rows.append(("written", f"{out_dir}/{{{', '.join(files)}}}" + (f" (not written: {', '.join(sorted(missing))})"
                                                                   if missing else "")))
    table = "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
    print(table)
    log_file = Path(out_dir) / "run.log"  # Hydra's log of the run: the table belongs there too
    if log_file.is_file():
        try:
            with log_file.open("a") as f:
                f.write(table + "\n")
        except OSError:  # a full disk: the table was printed, the files named above
            pass


def task(dcfg) -> None:
    """One run of a composed config in its Hydra job (`main`, or testbed.hydra_once)."""
    from hydra.core.hydra_config import HydraConfig

    from testbed.timeline.rundir import RunDirError
    out_dir = HydraConfig.get().runtime.output_dir
    try:
        cfg: Config = quiet_in_multirun(to_config(dcfg))
        run(cfg, out_dir)
    except RunDirError as e:  # the directory is another run's: nothing is written there
        _failed(out_dir, 2, f"error: {e}", refused=True)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        _failed(out_dir, 2, f"error: {e}")
    except RuntimeError as e:  # the run stopped early; what was done is written
        _failed(out_dir, 1, f"error: {e}")
    except KeyboardInterrupt:  # ends a sweep too
        print(f"interrupted: {_what_was_kept(out_dir)}", file=sys.stderr)
        sys.exit(130)
    except Terminated:
        print(f"terminated (SIGTERM): {_what_was_kept(out_dir)}", file=sys.stderr)
        sys.exit(143)


main = hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")(task)


def quiet_in_multirun(cfg: Config) -> Config:
    """No progress bar in a multirun's jobs unless the command line asks for one: parallel
    jobs' bars interleave on stderr (tens of KB of noise)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN and not any(o.split("=", 1)[0].lstrip("+~") == "progress"
                                               for o in hc.overrides.task):
        cfg.progress = False
    return cfg


def _failed(out_dir: str, code: int, message: str, refused: bool = False) -> None:
    """A failed run exits with `code`; a failed job of a multirun leaves a summary.json saying
    why (when its directory has none) and lets the sweep go on: the combined table names it
    and the sweep exits 1 (testbed.sweep.CombineSweep). A job refused its directory (another
    run's) writes nothing there: the sweep directory's list of refused jobs names it."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    print(message, file=sys.stderr)
    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        sys.exit(code)
    if refused:
        from testbed.sweep import note_refused
        note_refused(hc.sweep.dir, Path(out_dir).name, message.removeprefix("error: "))
        return
    summary = Path(out_dir) / "summary.json"
    if not summary.exists():
        try:
            summary.write_text(json.dumps({"complete": False, "error": message.removeprefix("error: "),
                                           "exit_code": code, "metrics": {}}, indent=2) + "\n")
        except OSError as e:  # the sweep goes on; its table lists the job as unreadable
            print(f"error: could not write {summary} ({e.strerror or e})", file=sys.stderr)


def _what_was_kept(out_dir: str) -> str:
    if (Path(out_dir) / "summary.json").is_file():
        return f"what was done is in {out_dir} (summary.json says complete: false)"
    return "before the run started (loading); nothing was written"


def precheck(argv: list[str]) -> str | None:
    """Compose the command line's overrides as Hydra will (a multirun: its first job), before
    Hydra does: a bad group option, key or value is then one line naming it (Hydra's own error
    is a dozen lines). None when they compose; the run's own checks come later."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException, OverrideParseException

    from testbed.config import composition_error, compose_raw, first_of_each_sweep
    flags = [a for a in argv if a.startswith("-")]
    if any(f not in ("-m", "--multirun") for f in flags):  # --help, --cfg, -c ...: Hydra's own business
        return None
    overrides = [a for a in argv if not a.startswith("-") and not a.lstrip("+~").startswith("hydra")]
    for a in overrides:
        try:
            OverridesParser.create().parse_overrides([a])
        except OverrideParseException as e:
            return f"{a}: not an override Hydra can parse ({str(e).splitlines()[0]})"
    one_job = first_of_each_sweep(overrides) if flags else overrides
    try:
        compose_raw(one_job)
    except HydraException as e:
        return composition_error(e, one_job)
    return None


if __name__ == "__main__":
    if {"--help", "-h"} & set(sys.argv[1:]):  # every knob with a line of help (Hydra's lists none)
        from testbed.config_help import render
        print(render())
        sys.exit(0)
    from testbed import hydra_once
    from testbed.config import note_swept_keys
    argv = sys.argv[1:]
    note_swept_keys(argv)
    if not hydra_once.run_if_plain(task, CONF_DIR, "config", argv):  # a multirun, or what the precheck names
        bad = precheck(argv)
        if bad:
            print(f"error: {bad}", file=sys.stderr)
            sys.exit(2)
        main()
