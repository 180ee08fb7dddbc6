"""Sweeps: the Hydra callback that combines a multirun, and an entry point for sweepers
that optimise (Optuna).

- `CombineSweep` (conf/config.yaml's hydra.callbacks): after a multirun, one table of every
  job's overrides and metrics, sweep.parquet and sweep.csv in the sweep directory. Jobs that
  cannot be read are named and skipped. The reading is analysis.load's, the one
  implementation `python -m testbed.report` uses as well.
- `python -m testbed.sweep ...`: the same run as `python -m testbed.run`, but the task returns
  one metric of the run's summary (default `goodput`; `+objective=p99_ttft_ms` picks another),
  which is what an optimising sweeper needs:

      python -m testbed.sweep -m +sweep=optuna_token_budget          # conf/sweep/optuna_token_budget.yaml
"""
from __future__ import annotations

import logging
import math
import sys
from pathlib import Path

import hydra
from hydra.experimental.callback import Callback

log = logging.getLogger(__name__)


def combine(sweep_dir: str | Path):
    """(table, skipped): a row per readable job (job, overrides, complete, error, metrics; a
    failed or cut-short job has complete False and its error) and "job: reason" for each job
    that could not be read."""
    from analysis.load import LoadError, load_summaries
    try:
        return load_summaries(sweep_dir, include_partial=True)
    except LoadError as e:
        import pandas as pd
        return pd.DataFrame(), [str(e)]


def write_table(summaries, directory: str | Path) -> Path:
    """sweep.parquet and sweep.csv of a combined table; returns the Parquet path."""
    from analysis.load import table
    directory = Path(directory)
    t = table(summaries.drop(columns=["path"], errors="ignore"))
    t.to_parquet(directory / "sweep.parquet")
    t.to_csv(directory / "sweep.csv", index=False)
    return directory / "sweep.parquet"


REFUSED = ".refused_jobs"  # in the sweep directory: "job<TAB>why" per job refused its directory


def note_refused(sweep_dir: str | Path, job: str, why: str) -> None:
    """A job that found its directory held by another run (a sweep run again into its own
    directory) cannot say so there; it is listed beside the jobs instead (one short append a
    job: whole lines even from parallel jobs)."""
    with open(Path(sweep_dir) / REFUSED, "a") as f:
        f.write(f"{job}\t{' '.join(why.split())}\n")


def take_refused(sweep_dir: str | Path) -> list[tuple[str, str]]:
    path = Path(sweep_dir) / REFUSED
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    path.unlink()
    return [tuple(line.split("\t", 1)) for line in lines if "\t" in line]


class CombineSweep(Callback):
    def on_multirun_start(self, config, **kwargs) -> None:
        take_refused(config.hydra.sweep.dir)  # a list left by a sweep that did not end is not this one's

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        refused = take_refused(sweep_dir)
        df, skipped = combine(sweep_dir)
        for s in skipped:
            log.warning("skipped job %s", s)
        if len(df):
            path = write_table(df, sweep_dir)
            print(f"combined {len(df)} jobs into {path}" + (f" ({len(skipped)} skipped)" if skipped else ""))
        failed = df[df["complete"] == False] if len(df) else df  # noqa: E712 (a column of bools and Nones)
        for _, row in failed.iterrows():
            print(f"failed job {row['job']}: {row['error']}", file=sys.stderr)
        for job, why in refused:  # its directory's row, if any, is the other run's
            print(f"failed job {job}: {why}", file=sys.stderr)
        if len(failed) or skipped or refused:
            sys.exit(1)


# ---- an objective for optimising sweepers --------------------------------------------------------
from testbed.config import register_schema  # noqa: E402

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
register_schema()


SLO_OBJECTIVES = ("goodput", "request_goodput", "slo_attainment")  # metrics only a run with an SLO has


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def optimize(dcfg) -> float:
    """Run one configuration and return summary.metrics[objective] (a float for the sweeper)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from testbed.config import ConfigError, to_config
    from testbed.run import quiet_in_multirun, run
    with open_dict(dcfg):
        objective = str(dcfg.pop("objective", "goodput"))
    try:
        cfg = quiet_in_multirun(to_config(dcfg))
        if objective in SLO_OBJECTIVES and all(v is None for v in (cfg.slo.ttft_ms, cfg.slo.tpot_ms, cfg.slo.e2e_ms)):
            raise ValueError(f"objective {objective!r} needs an SLO: slo.ttft_ms, slo.tpot_ms or slo.e2e_ms "
                             f"(+objective=NAME picks another metric)")  # before the run, not after it
        summary = run(cfg, HydraConfig.get().runtime.output_dir)
        value = summary["metrics"].get(objective)
        if value is None:
            raise ValueError(f"objective {objective!r} is not among the run's metrics; "
                             f"known: {', '.join(summary['metrics'])} (the run's files are written)")
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    value = float(value)
    log.info("objective %s = %s", objective, value)
    return value if math.isfinite(value) else float("nan")


if __name__ == "__main__":
    from testbed.config import note_swept_keys
    note_swept_keys(sys.argv[1:])
    optimize()
