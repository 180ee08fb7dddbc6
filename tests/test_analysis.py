"""analysis/: loading runs and sweeps, metrics, run-vs-run comparison, plots, the notebooks,
and the sweep configs (joblib, SLURM, Ray, Optuna). Runs real (small) simulations."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import analysis as A
from analysis.load import load_summaries, parse_value

REPO = Path(__file__).resolve().parents[1]
N = 150  # requests per run


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """2 policies x 2 rates on ShareGPT, N requests each, through the CLI (joblib launcher)."""
    d = tmp_path_factory.mktemp("sweep") / "sw"
    return A.run_sweep({"policy": ["prefill_first", "chunked"], "trace.rate": [4, 16]},
                       fixed=[f"trace.num_requests={N}"], sweep_dir=d)


@pytest.fixture(scope="module")
def results(sweep):
    return A.load(sweep, warn=False)


def job_of(results, policy, rate):
    s = results.summaries
    return s.loc[(s["policy"] == policy) & (s["trace.rate"] == rate), "job"].iloc[0]


# ---- load ------------------------------------------------------------------------------------
def test_load_sweep_has_overrides_as_columns(results):
    s = results.summaries
    assert len(s) == 4 and results.skipped == []
    assert set(s["policy"]) == {"prefill_first", "chunked"}
    assert sorted(s["trace.rate"].unique()) == [4, 16]  # numbers, not strings
    assert s["trace"].eq("sharegpt").all()  # group name from the config when not overridden
    assert results.varying() == ["policy", "trace.rate"]
    assert len(results.requests) == 4 * N and set(results.requests["job"]) == set(s["job"])
    assert {"job", "policy", "trace.rate"} <= set(results.steps.columns) and len(results.steps) > 4 * N
    assert "progress" not in s  # output-only overrides are not sweep axes
    assert s["offered_rate"].between(2, 25).all()
    assert len(results.configs) == 4 and "policy.token_budget" in results.configs
    assert list(results.label()) == [f"policy={p}, rate={r}" for p, r in zip(s["policy"], s["trace.rate"])]


def test_metrics_agree_with_summary_json(results, sweep):
    g = A.metrics.summarize_groups(results.requests, results.steps, by="job")
    for _, row in g.iterrows():
        job = results.summaries.set_index("job").loc[row["job"]]
        on_disk = json.loads((sweep / row["job"] / "summary.json").read_text())["metrics"]
        for k in ("p99_ttft_ms", "median_tpot_ms", "request_throughput", "mean_kv_utilization"):
            assert row[k] == pytest.approx(on_disk[k]) and job[k] == pytest.approx(on_disk[k])


def test_load_one_run(results):
    path = Path(results.summaries["path"].iloc[0])
    one = A.load(path)
    assert len(one.summaries) == 1 and one.summaries["job"].iloc[0] == path.name
    assert one.summaries["policy"].iloc[0] == "prefill_first" and len(one.requests) == N
    assert one.varying() == []


def test_parse_value():
    assert parse_value("8") == 8 and parse_value("0.5") == 0.5 and parse_value("inf") == float("inf")
    assert parse_value("true") is True and parse_value("null") is None
    assert parse_value("'a b'") == "a b" and parse_value("chunked") == "chunked"


def test_broken_and_partial_jobs_are_named_and_skipped(sweep, tmp_path):
    d = tmp_path / "sw"
    shutil.copytree(sweep, d)
    good = sorted(p for p in d.iterdir() if p.is_dir())
    # 1: Hydra started the job, nothing was written (crash before the end)
    (d / "7_crashed" / ".hydra").mkdir(parents=True)
    (d / "7_crashed" / ".hydra" / "overrides.yaml").write_text("- policy=chunked\n")
    # 2: summary.json cut mid-write
    shutil.copytree(good[0], d / "8_badjson")
    (d / "8_badjson" / "summary.json").write_text('{"metrics": {"p99')
    # 3: requests.parquet truncated
    shutil.copytree(good[1], d / "9_badparquet")
    p = d / "9_badparquet" / "requests.parquet"
    p.write_bytes(p.read_bytes()[:100])
    # 4: interrupted run (Ctrl-C): complete false
    shutil.copytree(good[2], d / "10_partial")
    s = json.loads((d / "10_partial" / "summary.json").read_text())
    s.update(complete=False, error="interrupted (Ctrl-C)")
    (d / "10_partial" / "summary.json").write_text(json.dumps(s))

    r = A.load(d, warn=False)
    assert len(r.summaries) == 4
    reasons = dict(x.split(": ", 1) for x in r.skipped)
    assert set(reasons) == {"7_crashed", "8_badjson", "9_badparquet", "10_partial"}
    assert "no summary.json" in reasons["7_crashed"]
    assert "summary.json unreadable" in reasons["8_badjson"]
    assert "requests.parquet unreadable" in reasons["9_badparquet"]
    assert "partial" in reasons["10_partial"]
    assert len(A.load(d, include_partial=True, warn=False).summaries) == 5

    # the sweep table (summary.json only) and the Hydra callback use the same reading; the
    # callback keeps a cut-short job as a row (complete False, its error) so the table names it
    table, skipped = load_summaries(d)
    assert len(table) == 5 and {x.split(":")[0] for x in skipped} == {"7_crashed", "8_badjson", "10_partial"}
    from testbed.sweep import combine
    t2, s2 = combine(d)
    assert set(t2["job"]) == set(table["job"]) | {"10_partial"} and s2 == [x for x in skipped if "10_partial" not in x]
    assert t2.loc[t2["job"] == "10_partial", "complete"].tolist() == [False]


def test_load_errors(tmp_path):
    with pytest.raises(A.LoadError, match="no such directory"):
        A.load(tmp_path / "nope")
    with pytest.raises(A.LoadError, match="no run directories"):
        A.load(tmp_path)
    (tmp_path / "0_x" / ".hydra").mkdir(parents=True)
    (tmp_path / "0_x" / ".hydra" / "overrides.yaml").write_text("[]\n")
    with pytest.raises(A.LoadError, match="0_x: no summary.json"):
        A.load(tmp_path, warn=False)


# ---- metrics -----------------------------------------------------------------------------------
def test_percentiles_slo_and_timelines(results):
    req, steps = results.requests, results.steps
    pct = A.metrics.percentiles(req, by="policy")
    assert set(pct["policy"]) == {"prefill_first", "chunked"}
    for m in ("ttft", "tpot", "itl", "e2e", "queue"):
        assert (pct[f"median_{m}_ms"] <= pct[f"p99_{m}_ms"]).all()
    itl = A.metrics.latency_values(req[req["job"] == results.jobs[0]], "itl")
    assert len(itl) == sum(max(len(t) - 1, 0) for t in req.loc[req["job"] == results.jobs[0], "token_times_s"])

    loose = A.metrics.slo_attainment(req, 1e9, 1e9)
    assert np.allclose(loose["slo_attainment"], 1.0) and np.allclose(loose["goodput"], loose["request_throughput"])
    strict = A.metrics.slo_attainment(req, 200, 15)
    assert (strict["goodput"] <= loose["goodput"] + 1e-9).all() and (strict["slo_attainment"] < 1).any()
    curve = A.metrics.slo_curve(req, [50, 200, 1e6], 1e9)
    for _, g in curve.groupby("job"):
        assert g["slo_attainment"].is_monotonic_increasing

    one = results.job(job_of(results, "chunked", 16)).steps
    kv = A.metrics.kv_timeline(one)
    assert np.allclose(kv["used_frac"] + kv["cached_frac"] + kv["free_frac"], 1.0)
    assert len(A.metrics.kv_timeline(one, bin_s=1.0)) < len(kv)
    bc = A.metrics.batch_composition(one, bin_s=1.0)
    assert bc["prefill_tokens"].sum() == one["prefill_tokens"].sum()
    assert bc["decode_tokens"].sum() == one["decode_tokens"].sum() == (
        results.job(job_of(results, "chunked", 16)).requests["output_tokens"] - 1).clip(lower=0).sum()

    hits = A.metrics.prefix_hits(req, by="job").set_index("job")
    s = results.summaries.set_index("job")
    assert np.allclose(hits["hit_rate"], s.loc[hits.index, "prefix_cache_hit_rate"])
    cdf = A.metrics.latency_cdf(req, "ttft", by="policy")
    for _, g in cdf.groupby("policy"):
        assert g["value_ms"].is_monotonic_increasing and g["cdf"].iloc[-1] == 1.0


def test_metrics_bad_arguments_are_named(results):
    req, steps = results.requests, results.job(results.jobs[0]).steps
    with pytest.raises(ValueError, match="by='nope': no column 'nope'; the columns: "):
        A.metrics.percentiles(req, by="nope")
    with pytest.raises(ValueError, match="no SLO to attain"):
        A.metrics.slo_attainment(req, None, None)
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match=f"bin_s={bad!r} is invalid"):
            A.metrics.kv_timeline(steps, bin_s=bad)
        with pytest.raises(ValueError, match=f"bin_s={bad!r} is invalid"):
            A.metrics.batch_composition(steps, bin_s=bad)
    with pytest.raises(ValueError, match="candidate: not a requests.parquet table"):
        A.compare.join_requests(req, steps)
    # no requests (a filter that kept none): empty tables with their columns, no KeyError
    none = req.iloc[0:0]
    assert list(A.metrics.slo_attainment(none, 100, None).columns) == [
        "job", "completed", "request_throughput", "slo_attainment", "goodput"]
    assert len(A.metrics.percentiles(none)) == 0


# ---- compare -----------------------------------------------------------------------------------
def test_compare_run_against_itself_is_exact(results):
    path = results.summaries["path"].iloc[0]  # a path works as well as a frame
    j = A.compare.join_requests(path, results.job(results.jobs[0]))
    assert len(j) == N and j["same_shape"].all()
    e = A.compare.error_summary(j).set_index("metric")
    assert np.allclose(e[["bias_ms", "mae_ms", "mape", "p99_abs_rel_err"]].to_numpy(float), 0.0)
    assert np.allclose(e.loc[["ttft", "e2e"], "pearson_r"], 1.0)


def test_compare_two_policies_on_one_trace(results):
    ref = results.job(job_of(results, "prefill_first", 16)).requests
    cand = results.job(job_of(results, "chunked", 16)).requests
    out = A.compare.compare(ref, cand)
    j, e = out["joined"], out["errors"]
    assert len(j) == N and j["same_shape"].all() and j.attrs["only_reference"] == 0
    assert np.allclose(j["ttft_err_ms"], j["ttft_cand_ms"] - j["ttft_ref_ms"])
    assert list(e["metric"]) == ["ttft", "tpot", "e2e", "queue"] and (e["n"] == N).all()
    assert e.loc[e["metric"] == "ttft", "mae_ms"].iloc[0] > 0
    assert list(out["percentiles"]["run"]) == ["reference", "candidate"]
    ov = A.compare.cdf_overlay({"prefill_first": ref, "chunked": cand}, "ttft")
    assert set(ov["run"]) == {"prefill_first", "chunked"} and len(ov) == 2 * N
    # requests missing from one side are counted, not joined
    j2 = A.compare.join_requests(ref, cand[cand["rid"] >= 10])
    assert len(j2) == N - 10 and j2.attrs["only_reference"] == 10
    with pytest.raises(ValueError, match="4 jobs"):
        A.compare.join_requests(results, results)


def test_step_time_error_in_the_simulator_is_only_host_stretch(results):
    """The simulator's device time is the cost model's, stretched only where the host's launch
    outlasts it (the calibrated model's eager steps): never shorter."""
    st = A.compare.step_time_error(results.steps)
    assert set(st["kind"]) <= {"prefill", "decode", "mixed"} and "decode" in set(st["kind"])
    assert (st["mean_rel_err"] <= 1e-12).all() and st["steps"].sum() == len(results.steps)
    s = results.steps
    assert (s["duration_s"] >= s["predicted_s"] - 1e-12).all()


# ---- plots -------------------------------------------------------------------------------------
def test_plots_name_a_missing_column_or_request(results):
    from analysis import plots as P
    one = results.job(results.jobs[0])
    with pytest.raises(ValueError, match="by='nope': no column 'nope'"):
        P.latency_cdfs(results.requests, by="nope")  # was one line for all, silently
    with pytest.raises(ValueError, match="by='nope': no column 'nope'"):
        P.load_curves(results.summaries, x="trace.rate", by="nope")
    with pytest.raises(ValueError, match="bars: no column 'nope'"):
        P.bars(results.summaries, x="policy", y="nope")
    with pytest.raises(ValueError, match=r"rids \[99999\] are not in these requests"):
        P.gantt(one.requests, rids=[99999])
    for kw in ({"n": 0}, {"start": 1.5}):
        with pytest.raises(ValueError, match="n must be >= 1 and start a fraction of the run"):
            P.pick_requests(one.requests, **kw)


def test_plots_write_labelled_pngs(results, tmp_path):
    from analysis import plots as P
    one = results.job(job_of(results, "chunked", 16))
    figs = {
        "cdf": P.latency_cdfs(results.requests, by="policy"),
        "load": P.load_curves(results.summaries, x="trace.rate", by="policy"),
        "gantt": P.gantt(one.requests, n=8),
        "kv": P.kv_timeline(one.steps),
        "overlay": P.cdf_overlay(A.compare.cdf_overlay({"a": one.requests, "b": results.job(results.jobs[0]).requests})),
        "bars": P.bars(results.summaries, "policy", "p99_ttft_ms", hue="trace.rate"),
    }
    for name, fig in figs.items():
        drawn = [ax for ax in fig.axes if ax.get_visible() and ax.has_data()]
        for ax in drawn:  # stacked panels share the bottom panel's x label
            shared = ax.get_shared_x_axes().get_siblings(ax)
            assert ax.get_ylabel() and any(a.get_xlabel() for a in shared), (name, ax.get_title())
        path = P.save(fig, tmp_path / f"{name}.png")
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    assert "TTFT (ms)" in [a.get_xlabel() for a in figs["cdf"].axes]
    assert figs["load"].axes[0].get_xlabel() == "arrival rate (req/s)"
    with pytest.raises(ValueError, match="one job"):
        P.gantt(results.requests)


def test_gantt_draws_each_prefill_chunk_over_its_step(results):
    from matplotlib.colors import to_rgba

    from analysis import plots as P
    one = results.job(job_of(results, "chunked", 16))
    r = one.requests
    rids = list(r.sort_values("prefill_chunks")["rid"].iloc[-4:])  # the most chunked requests
    fig = P.gantt(r, rids=rids, steps=one.steps)
    chunks = [p for p in fig.axes[0].patches if p.get_edgecolor() == to_rgba("black")]
    want = r.set_index("rid").loc[rids]
    assert len(chunks) == int(want["prefill_chunks"].sum()) > len(rids)
    # each chunk spans the step it was scheduled in: starts at a step's start, ends at its end
    starts = set(one.steps["start_s"].round(9))
    for p in chunks:
        assert round(p.get_x(), 9) in starts
    ends = {round(a, 9): round(b, 9) for a, b in zip(one.steps["start_s"], one.steps["end_s"])}
    assert all(round(p.get_x() + p.get_width(), 6) == round(ends[round(p.get_x(), 9)], 6) for p in chunks)


# ---- notebooks -----------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name,requests", [("policy_comparison", 120), ("prefix_cache", 200)])
def test_notebook_executes(name, requests, tmp_path, monkeypatch):
    """Top to bottom, on smaller sweeps than the notebooks' own defaults (TESTBED_NB_REQUESTS)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(REPO / "analysis" / f"{name}.ipynb", as_version=4)
    monkeypatch.setenv("TESTBED_NB_OUT", str(tmp_path))  # the kernel inherits the environment
    monkeypatch.setenv("TESTBED_NB_REQUESTS", str(requests))
    # the kernel imports this checkout's packages, not another one installed in the environment
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                            resources={"metadata": {"path": str(REPO / "analysis")}}).execute()
    images = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors and images >= 4


# ---- sweep configs: SLURM, Ray, Optuna -------------------------------------------------------------
def compose(overrides):
    from hydra import compose as hcompose
    from hydra import initialize_config_dir

    from testbed.config import register_schema
    register_schema()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return hcompose("config", overrides=overrides, return_hydra_config=True)


def test_slurm_launcher_config_makes_an_sbatch_script(tmp_path, monkeypatch):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    submitit = pytest.importorskip("submitit")
    from omegaconf import OmegaConf
    cfg = compose(["hydra/launcher=slurm", "hydra.launcher.partition=cpu", f"hydra.sweep.dir={tmp_path}",
                   "hydra.launcher.setup=[. .venv/bin/activate]"])
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert launcher["_target_"].endswith("SlurmLauncher") and launcher["cpus_per_task"] == 1
    assert launcher["submitit_folder"] == f"{tmp_path}/.submitit/%j"
    # what the plugin hands submitit (its launch(): base keys as they are, the rest slurm_*)
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    params = {k if k in base else f"slurm_{k}": v for k, v in launcher.items()
              if k not in ("_target_", "submitit_folder", "max_num_timeout")}
    fake = tmp_path / "bin"  # submitit looks for srun before it writes anything; nothing is submitted
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\nexit 1\n")
    (fake / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    ex = submitit.AutoExecutor(folder=tmp_path, cluster="slurm", slurm_max_num_timeout=0)
    ex.update_parameters(**params)
    script = ex._executor._make_submission_file_text("python -m testbed.run", "uid")
    for line in ("#SBATCH --partition=cpu", "#SBATCH --cpus-per-task=1", "#SBATCH --time=60", "#SBATCH --mem=4GB",
                 ". .venv/bin/activate"):
        assert line in script


def test_ray_launcher_config_composes_without_the_plugin():
    from omegaconf import OmegaConf
    cfg = compose(["hydra/launcher=ray_cluster"])
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert launcher["_target_"] == "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher"
    assert launcher["ray"]["remote"] == {"num_cpus": 1, "num_gpus": 0, "max_calls": 1}
    assert "multirun/" in launcher["ray"]["init"]["runtime_env"]["excludes"]


def sweep_env() -> dict:
    """The environment of a sweep's subprocess: this checkout first on the path (the launchers'
    job processes import testbed), no Ray cluster address inherited (a local Ray starts)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return env


def check_four_jobs(d: Path) -> None:
    """A finished 4-job sweep of trace.rate=1,2,4,8: every job complete, one combined table."""
    table = pd.read_parquet(d / "sweep.parquet")
    assert sorted(table["trace.rate"]) == [1, 2, 4, 8] and table["complete"].all()
    for job in table["job"]:
        assert len(pd.read_parquet(d / job / "requests.parquet")) == 20


@pytest.mark.slow
def test_ray_launcher_runs_a_sweep_on_a_local_cluster(tmp_path):
    """hydra/launcher=ray_cluster for real: ray.init starts a local Ray on this machine and the
    four jobs run as Ray tasks in its worker processes."""
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")  # the ray extra (CI installs it)
    d = tmp_path / "ray"
    p = subprocess.Popen([sys.executable, "-m", "testbed.run", "-m", "hydra/launcher=ray_cluster",
                          "trace.rate=1,2,4,8", "trace.num_requests=20", "progress=false", f"hydra.sweep.dir={d}",
                          "+hydra.launcher.ray.init.num_cpus=2", "+hydra.launcher.ray.init.include_dashboard=false"],
                         cwd=REPO, env=sweep_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = p.communicate(timeout=540)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, out[-3000:]
    assert "Ray Launcher is launching 4 jobs" in out
    # Ray forwards its workers' output prefixed with the task and the worker's pid
    workers = {int(pid) for pid in re.findall(r"\(_run_job pid=(\d+)\)", out)}
    assert workers and p.pid not in workers
    check_four_jobs(d)


@pytest.mark.slow
def test_slurm_local_launcher_runs_a_sweep(tmp_path):
    """hydra/launcher=slurm_local: submitit's local executor runs each job in its own process
    from the pickled job, as SLURM array tasks would, with submitit's logs per job."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    d = tmp_path / "local"
    p = subprocess.run([sys.executable, "-m", "testbed.run", "-m", "hydra/launcher=slurm_local",
                        "trace.rate=1,2,4,8", "trace.num_requests=20", "progress=false", f"hydra.sweep.dir={d}"],
                       cwd=REPO, env=sweep_env(), capture_output=True, text=True, timeout=540)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    check_four_jobs(d)
    jobs = sorted((d / ".submitit").glob("*/*_result.pkl"))  # one folder per submitit job, named by its id
    assert len(jobs) == 4 and len({j.parent for j in jobs}) == 4


def test_slurm_local_has_the_per_job_resources_of_slurm():
    from omegaconf import OmegaConf
    slurm = OmegaConf.to_container(compose(["hydra/launcher=slurm"]).hydra.launcher)
    local = OmegaConf.to_container(compose(["hydra/launcher=slurm_local"]).hydra.launcher)
    assert local["_target_"].endswith("LocalLauncher")
    for key in ("timeout_min", "cpus_per_task", "mem_gb", "tasks_per_node", "nodes", "gpus_per_node",
                "submitit_folder"):
        assert local[key] == slurm[key], key


def test_sweep_examples_compose():
    from omegaconf import OmegaConf
    cfg = compose(["+sweep=policy_load"])
    assert cfg.hydra.launcher._target_.endswith("JoblibLauncher")
    assert dict(cfg.hydra.sweeper.params) == {"policy": "prefill_first,decode_first,chunked", "trace.rate": "4,8,12,16"}
    assert cfg.trace.num_requests == 1000
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    cfg = compose(["+sweep=optuna_token_budget"])
    sw = OmegaConf.to_container(cfg.hydra.sweeper, resolve=True)
    assert sw["_target_"].endswith("OptunaSweeper") and sw["direction"] == "maximize"
    assert "policy.token_budget" in sw["params"] and cfg.slo.ttft_ms == 500
    # the trials of a batch run side by side
    assert cfg.hydra.launcher._target_.endswith("JoblibLauncher") and cfg.hydra.launcher.n_jobs == sw["n_jobs"] == 2


@pytest.mark.slow
def test_optuna_study_finds_a_token_budget(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    d = tmp_path / "study"
    p = subprocess.run([sys.executable, "-m", "testbed.sweep", "-m", "+sweep=optuna_token_budget",
                        "hydra.sweeper.n_trials=3", "hydra.sweeper.n_jobs=1", "trace.num_requests=100",
                        f"hydra.sweep.dir={d}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    import yaml
    best = yaml.safe_load((d / "optimization_results.yaml").read_text())
    assert 64 <= best["best_params"]["policy.token_budget"] <= 8192 and best["best_value"] > 0
    table = pd.read_parquet(d / "sweep.parquet")
    assert len(table) == 3 and table["goodput"].max() == pytest.approx(best["best_value"])
    assert "policy.token_budget" in table


def test_optimize_objective_needs_an_slo(tmp_path):
    p = subprocess.run([sys.executable, "-m", "testbed.sweep", "trace.num_requests=20", "progress=false",
                        f"hydra.run.dir={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1] == (
        "error: objective 'goodput' needs an SLO: slo.ttft_ms, slo.tpot_ms or slo.e2e_ms (+objective=NAME picks "
        "another metric)")
    assert not (tmp_path / "summary.json").exists()  # refused before running
    p = subprocess.run([sys.executable, "-m", "testbed.sweep", "trace.num_requests=20", "progress=false",
                        "+objective=nope", f"hydra.run.dir={tmp_path / 'b'}"], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("error: objective 'nope' is not among the run's metrics")


@pytest.mark.slow
def test_sim_vs_engine_notebook_executes(tmp_path, monkeypatch):
    """The fidelity notebook top to bottom on one small cell; its replay goes to TESTBED_NB_OUT."""
    fidelity = REPO / "benchmarks" / "results" / "fidelity"
    if not (fidelity / "fidelity.json").is_file():
        pytest.skip(f"{fidelity / 'fidelity.json'} not written yet (python -m testbed.fidelity report)")
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(REPO / "analysis" / "sim_vs_engine.ipynb", as_version=4)
    cell = "qwen3_0_6b-prefill_first-mooncake_conversation-light"
    monkeypatch.setenv("TESTBED_NB_OUT", str(tmp_path))  # the kernel inherits the environment
    monkeypatch.setenv("TESTBED_FIDELITY_CELL", cell)
    monkeypatch.delenv("TESTBED_FIDELITY_DIR", raising=False)
    nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                            resources={"metadata": {"path": str(REPO / "analysis")}}).execute()
    images = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors and images >= 2
    assert (tmp_path / "sim" / cell / "requests.parquet").is_file()
