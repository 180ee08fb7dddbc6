"""Read run directories into DataFrames.

A *run* directory holds what `python -m testbed.run` writes: requests.parquet, steps.parquet,
summary.json and Hydra's .hydra/overrides.yaml. A *sweep* (multirun) directory holds one run
directory per job, at any depth (multirun/<date>/<time>/<num>_<overrides>/ or a whole
multirun/ tree). `load(path)` takes either and returns a `Results` whose three frames carry
a `job` column plus one column per Hydra override of that job (`policy`, `trace.rate`, ...),
so `results.summaries.pivot(index="trace.rate", columns="policy", values="p99_ttft_ms")`
just works.

A job directory that cannot be read (no summary.json, bad JSON, a missing or corrupt
Parquet file) or that was cut short (`complete: false`) is skipped and named in
`Results.skipped`, never a crash of the whole load.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

RUN_FILES = ("summary.json", "requests.parquet", "steps.parquet")
# Config groups whose chosen name becomes a column when the job did not override it, so that
# a single run (no overrides) can still be grouped "by policy" or "by trace".
GROUP_COLUMNS = ("backend", "policy", "trace", "eviction", "cache", "model", "hardware")


class LoadError(Exception):
    """Nothing loadable at the given path (the report turns this into a one-line error)."""


@dataclass
class Results:
    """One run or a sweep, as DataFrames.

    summaries: a row per job: job, override columns, group names, `complete`, every metric
               of summary.json (names as serving benchmarks use them), wall_time_s.
    requests:  requests.parquet of every job, with job + override + group columns in front.
    steps:     steps.parquet of every job, likewise (empty when loaded with steps=False).
    configs:   a row per job: the resolved config flattened to dotted keys (`policy.token_budget`).
    skipped:   "job-name: reason" for every directory that was not loaded.
    keys:      the override / group column names, in order (what tells jobs apart).
    """
    root: Path
    summaries: pd.DataFrame
    requests: pd.DataFrame
    steps: pd.DataFrame
    configs: pd.DataFrame
    skipped: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)

    @property
    def jobs(self) -> list[str]:
        return list(self.summaries["job"])

    def varying(self) -> list[str]:
        """The key columns that take more than one value across the jobs (the sweep axes)."""
        return [k for k in self.keys if k in self.summaries and self.summaries[k].nunique(dropna=False) > 1]

    def label(self, keys: list[str] | None = None) -> pd.Series:
        """A short readable label per job, from the varying keys (or the job name)."""
        keys = self.varying() if keys is None else keys
        return job_labels(self.summaries, keys)

    def job(self, name: str) -> "Results":
        """The same Results narrowed to one job."""
        if name not in self.jobs:
            raise KeyError(f"no job {name!r}; jobs: {', '.join(self.jobs)}")
        pick = lambda df: df[df["job"] == name].reset_index(drop=True) if "job" in df else df  # noqa: E731
        return Results(self.root, pick(self.summaries), pick(self.requests), pick(self.steps),
                       pick(self.configs), [], list(self.keys))


def job_labels(summaries: pd.DataFrame, keys: list[str]) -> pd.Series:
    keys = [k for k in keys if k in summaries]
    if not keys:
        return summaries["job"].astype(str)
    return summaries[keys].apply(lambda r: ", ".join(f"{k.split('.')[-1]}={_fmt(v)}" for k, v in r.items()),
                                 axis=1)


def _fmt(v) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


# ---- finding job directories -----------------------------------------------------------------
def is_run_dir(d: Path) -> bool:
    """A directory that is (or tried to be) one run: it has a run file or Hydra's .hydra/."""
    return any((d / f).exists() for f in RUN_FILES) or (d / ".hydra" / "overrides.yaml").exists()


def find_jobs(root: str | Path) -> list[Path]:
    """Run directories at or under root, in a stable order (job number first when present)."""
    root = Path(root)
    if is_run_dir(root):
        return [root]
    found = []

    def walk(d: Path):
        for child in sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if is_run_dir(child):
                found.append(child)
            else:
                walk(child)
    walk(root)
    return sorted(found, key=_job_sort_key)


def _job_sort_key(p: Path):
    head = p.name.split("_", 1)[0]
    return (str(p.parent), int(head) if head.isdigit() else math.inf, p.name)


# ---- overrides -------------------------------------------------------------------------------
def parse_value(text: str):
    """A Hydra override value as a Python scalar: 8 -> 8, 0.5 -> 0.5, inf -> inf, true -> True,
    null -> None, 'a b' -> 'a b'; anything else stays a string."""
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        return t[1:-1]
    low = t.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none", "~"):
        return None
    try:
        return int(t)
    except ValueError:
        pass
    try:
        return float(t)
    except ValueError:
        return t


def read_overrides(job: Path, summary: dict | None = None) -> dict:
    """{key: value} from the run's own record of its overrides (summary.json's `overrides`),
    else from the job's .hydra/overrides.yaml, which a later command into the same directory
    may have rewritten (runs written before summary.json held them). `+`/`++` prefixes dropped,
    deletions `~key` skipped; keys that only tune output (progress, hydra.*) are left out."""
    if summary is not None and isinstance(summary.get("overrides"), list):
        items = summary["overrides"]
    else:
        path = job / ".hydra" / "overrides.yaml"
        if not path.exists():
            return {}
        import yaml
        items = yaml.safe_load(path.read_text()) or []
    out = {}
    for item in items:
        item = str(item)
        if item.startswith("~") or "=" not in item:
            continue
        key, value = item.split("=", 1)
        key = key.lstrip("+")
        if key in ("progress", "check_every_step") or key.startswith("hydra."):
            continue
        out[key] = parse_value(value)
    return out


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


# ---- loading -----------------------------------------------------------------------------------
def _read_job(job: Path, want_requests: bool, want_steps: bool, include_partial: bool):
    """(summary row, config row, requests, steps) of one job; raises ValueError naming the problem."""
    summary_path = job / "summary.json"
    if not summary_path.exists():
        present = [f for f in RUN_FILES if (job / f).exists()]
        raise ValueError("no summary.json (job failed or still running)" +
                         (f"; has {', '.join(present)}" if present else ""))
    try:
        s = json.loads(summary_path.read_text())
        metrics = s["metrics"]
    except (OSError, ValueError) as e:
        raise ValueError(f"summary.json unreadable ({type(e).__name__}: {e})") from None
    except (KeyError, TypeError):
        raise ValueError("summary.json has no 'metrics'") from None
    if s.get("complete") is False and not include_partial:
        raise ValueError(f"partial run (complete: false: {s.get('error')})")
    config = s.get("config") or {}
    overrides = read_overrides(job, s)
    groups = {g: (config.get(g) or {}).get("name") for g in GROUP_COLUMNS
              if g not in overrides and isinstance(config.get(g), dict)}
    keys = {**overrides, **groups}
    row = {"job": job.name, **keys, "complete": s.get("complete"), "error": s.get("error"),
           **metrics, "wall_time_s": s.get("wall_time_s"), "path": str(job)}
    frames = []
    for name, want in (("requests", want_requests), ("steps", want_steps)):
        if not want:
            frames.append(None)
            continue
        path = job / f"{name}.parquet"
        if not path.exists():
            raise ValueError(f"no {name}.parquet")
        try:
            df = pd.read_parquet(path)
        except Exception as e:  # pyarrow raises several types for truncated / foreign files
            raise ValueError(f"{name}.parquet unreadable ({type(e).__name__}: {e})") from None
        for k, v in reversed(list({"job": job.name, **keys}.items())):
            df.insert(0, k, v)
        frames.append(df)
    if frames[0] is not None:  # the load the run was offered, measured: comparable across traces
        from analysis.metrics import offered_rate
        row["offered_rate"] = offered_rate(frames[0])
    return row, {"job": job.name, **flatten(config)}, (list(overrides), list(groups)), frames[0], frames[1]


def load(path: str | Path, requests: bool = True, steps: bool = True, include_partial: bool = False,
         warn: bool = True) -> Results:
    """Load one run directory or every job under a sweep directory.

    requests / steps: read those Parquet files too (steps are the larger; skip them when only
    latencies matter). include_partial: keep runs marked `complete: false` (Ctrl-C).
    warn: print a line per skipped job to stderr. Raises LoadError when nothing is loadable."""
    root = Path(path)
    if not root.exists():
        raise LoadError(f"{root}: no such directory")
    if not root.is_dir():
        raise LoadError(f"{root}: not a directory")
    jobs = find_jobs(root)
    if not jobs:
        raise LoadError(f"{root}: no run directories (nothing with summary.json, *.parquet or .hydra/)")
    rows, cfgs, reqs, stps, skipped, over, groups = [], [], [], [], [], [], []
    for job in jobs:
        try:
            row, cfg, (ov, gr), rq, st = _read_job(job, requests, steps, include_partial)
        except ValueError as e:
            skipped.append(f"{job.relative_to(root) if job != root else job.name}: {e}")
            continue
        rows.append(row)
        cfgs.append(cfg)
        over += [x for x in ov if x not in over]
        groups += [x for x in gr if x not in groups]
        if rq is not None:
            reqs.append(rq)
        if st is not None:
            stps.append(st)
    if warn:
        import sys
        for s in skipped:
            print(f"skipped {s}", file=sys.stderr)
    if not rows:
        raise LoadError(f"{root}: no readable run; skipped " + "; ".join(skipped))
    # overridden group choices (policy=...), then overridden values (trace.rate=...), then the
    # group names filled in from the config
    keys = sorted(over, key=lambda k: ("." in k, over.index(k))) + [g for g in groups if g not in over]
    summaries = pd.DataFrame(rows)
    summaries = summaries[["job", *keys, *[c for c in summaries.columns if c != "job" and c not in keys]]]
    return Results(root, summaries, _concat(reqs), _concat(stps), pd.DataFrame(cfgs), skipped, keys)


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)] or frames[:1]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def load_summaries(path: str | Path, include_partial: bool = False) -> tuple[pd.DataFrame, list[str]]:
    """The combined table of a sweep (a row per job: job, overrides, metrics) and the skipped
    jobs, reading only summary.json files: what the Hydra callback writes as sweep.parquet."""
    r = load(path, requests=False, steps=False, include_partial=include_partial, warn=False)
    return r.summaries, r.skipped


def table(summaries: pd.DataFrame) -> pd.DataFrame:
    """summaries made storable as Parquet / CSV (object columns of mixed types become strings)."""
    out = summaries.copy()
    for c in out.columns:
        if out[c].dtype == object:
            kinds = {type(v) for v in out[c] if v is not None and not (isinstance(v, float) and math.isnan(v))}
            if len(kinds) > 1 or (kinds and not kinds <= {str, bool}):
                out[c] = out[c].map(lambda v: None if v is None else str(v))
    return out
