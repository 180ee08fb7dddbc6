"""Hydra callback: after a multirun, one combined table of every job's metrics and
overrides (sweep.parquet and sweep.csv in the sweep directory)."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from hydra.experimental.callback import Callback

log = logging.getLogger(__name__)


def combine(sweep_dir: str | Path):
    """Rows: one per job directory holding a summary.json; broken jobs are named and skipped."""
    import pandas as pd
    rows, broken = [], []
    for summary in sorted(Path(sweep_dir).glob("*/summary.json")):
        job = summary.parent
        try:
            s = json.loads(summary.read_text())
            overrides = (job / ".hydra" / "overrides.yaml")
            ov = {}
            if overrides.exists():
                for line in overrides.read_text().splitlines():
                    item = line.lstrip("- ").strip().strip("'\"")
                    if "=" in item:
                        k, v = item.split("=", 1)
                        ov[k] = v
            rows.append({"job": job.name, **ov, "complete": s.get("complete"), **s["metrics"]})
        except (OSError, ValueError, KeyError) as e:
            broken.append(f"{job.name}: {e}")
    return pd.DataFrame(rows), broken


class CombineSweep(Callback):
    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        df, broken = combine(sweep_dir)
        for b in broken:
            log.warning("skipped broken job %s", b)
        if len(df):
            df.to_parquet(sweep_dir / "sweep.parquet")
            df.to_csv(sweep_dir / "sweep.csv", index=False)
            print(f"combined {len(df)} jobs into {sweep_dir}/sweep.parquet")
