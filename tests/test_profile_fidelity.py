"""The step profiler (python -m testbed.profile), the engine's warm-up and synthetic steps,
and the fidelity experiment (python -m testbed.fidelity) end to end on the CPU engine."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SMOL_CPU = ["model=smollm2_135m", "model.weights=dummy", "engine.device=cpu", "engine.attention=torch",
            "engine.dtype=float32", "engine.num_pages=8192", "scheduler.max_running=8",
            "scheduler.max_step_tokens=256", "policy.token_budget=64",
            "engine.overlap=false"]  # overlap on the CPU: 5x slower steps (#16); bf16 on the CPU: the profiler 2.9x slower


def py(*args, timeout=600):
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------- pieces
def test_synthetic_batch_lays_out_prompts_and_interleaved_decode_tails():
    pytest.importorskip("torch")
    from testbed.engine.synthetic_batch import synthetic_host_batch
    hb = synthetic_host_batch([3, 1, 1], [2, 4, 9], 100, 1, 50, interleave=0.5)
    fb = hb.fb
    kv = fb.kv_indices.numpy()
    assert len(set(kv.tolist())) == len(kv) == 5 + 5 + 10
    assert fb.kv_indptr.tolist() == [0, 5, 10, 20] and fb.positions.tolist() == [2, 3, 4, 4, 9]
    # the prefill row is one run; decode rows: a run, then generated tokens side by side: the
    # 5-token tail alone for its first 3 steps, then beside the 2-token one (stride 2)
    assert kv[:5].tolist() == [0, 1, 2, 3, 4]
    assert np.diff(kv[8:10]).tolist() == [2] and np.diff(kv[15:20]).tolist() == [1, 1, 1, 2]
    assert max(kv) == 19  # no slot left between: 20 context tokens in 20 slots
    assert fb.out_cache_loc.tolist() == [2, 3, 4, kv[9], kv[19]]
    even = synthetic_host_batch([1, 1, 1], [9, 9, 9], 100, 1, 50, interleave=0.5).fb.kv_indices.numpy()
    assert [np.diff(even[i * 10 + 5:i * 10 + 10]).tolist() for i in range(3)] == [[3] * 4] * 3  # token j of row i: j * 3 + i
    assert sorted(synthetic_host_batch([1] * 4, [99, 9, 0, 40], 152, 1, 50, interleave=0.8).fb.kv_indices.tolist()) \
        == list(range(152))  # skewed tails in a pool just their size (side by side as rows x the longest: 352)
    with pytest.raises(ValueError, match="does not fit the pool of 10 slots"):
        synthetic_host_batch([8], [8], 10, 1, 50)


def test_warmup_covers_every_graph_size_token_count_kind_and_the_sampler():
    from testbed.engine.warmup import warmup_shapes
    sizes = [1, 2, 4, 8, 16, 32]
    shapes = warmup_shapes(1024, 48, sizes)
    decode_bs = {len(e) for e, c, _ in shapes if all(x == 1 for x in e) and all(x > 0 for x in c)}
    assert set(sizes) <= decode_bs and 33 in decode_bs and 48 in decode_bs  # eager beyond the graphs
    single = {e[0] for e, c, _ in shapes if len(e) == 1 and c == [0]}
    assert {1, 15, 16, 17, 1000, 1024} <= single and max(single) == 1024
    assert any(len(e) > 1 and e[0] > 1 and e[1] == 1 for e, _, _ in shapes)  # a mixed step
    assert any(t > 0 for _, _, t in shapes)  # the random sampler
    assert all(len(e) <= 48 for e, _, _ in shapes)


def test_profiler_grid_keeps_within_limits():
    from testbed.engine.profiler import decode_sizes, device_grid, shape_record
    assert decode_sizes([1, 2, 4, 8, 16], 16) == [1, 2, 4, 8, 16]
    assert decode_sizes([1, 2, 4, 8, 16], 64) == [1, 2, 4, 8, 16, 17, 40, 64]
    grid = device_grid(2048, 64, [1, 2, 4, 8, 16], max_kv=100_000)
    assert {sh.kind for sh in grid} == {"decode", "prefill", "mixed"} and {sh.pattern for sh in grid} == {"uniform", "spread", "skewed", "near", "served", "tailed"}
    from testbed.sim.costmodel.fit import sample_batch
    for sh in grid:
        assert len(sh.extend) <= 64 and sum(sh.extend) + sum(sh.cached) <= 100_000
        assert sum(sh.extend) <= 2048 or sh.kind == "mixed"
        # what a profile stores of a shape gives the shape back
        assert sample_batch(shape_record(sh)) == (sh.extend, sh.cached)
    # mixed steps of a budget-filling chunk over long prefixes beside skewed decode contexts, on
    # both sides of the fa2 plan's query-tile switch (16 decodes beside a 496-token chunk)
    from testbed.sim.costmodel.fit import Fa2Shape, fa2_plan
    fa = Fa2Shape(group=2, kv_heads=8, num_sms=132)
    skewed = [sh for sh in grid if sh.kind == "mixed" and sh.pattern == "skewed"]
    assert {sh.cached[0] for sh in skewed} >= {0, 12288} and all(sum(sh.extend) == 512 for sh in skewed)
    assert {fa2_plan(sh.extend, sh.cached, fa)[0] for sh in skewed} == {64, 128}
    assert all(max(sh.cached[1:]) > 2 * np.mean(sh.cached[1:]) for sh in skewed if len(sh.extend) > 16)
    # mixed steps as `chunked` serves them (a budget-filling chunk beside serving-like decodes), at
    # every fa2 query tile, with a mean packed query length on both sides of 64 several times over
    served = [sh for sh in device_grid(2048, 256, [1, 2, 4, 8, 16], max_kv=1_000_000)
              if sh.kind == "mixed" and sh.pattern == "served"]
    assert served and all(sum(sh.extend) == 512 for sh in served)
    assert {fa2_plan(sh.extend, sh.cached, fa)[0] for sh in served} == {16, 64, 128}
    packed = [sum(sh.extend) * 2 // len(sh.extend) for sh in served]
    assert sum(48 < p <= 64 for p in packed) >= 4 and sum(64 < p <= 96 for p in packed) >= 4
    # the eager base curve gets a fresh prompt at every piecewise-graph size within the limit
    pieces = [16, 32, 48, 400, 2048, 4096]
    fresh = {sum(sh.extend) for sh in device_grid(2048, 64, [1, 2, 4, 8, 16], 100_000, base_tokens=pieces)
             if sh.kind == "prefill" and len(sh.extend) == 1 and sh.cached == [0]}
    assert {16, 32, 48, 400, 2048} <= fresh and 4096 not in fresh


def test_every_grid_shape_fits_the_pool_it_is_built_for():
    """Each shape's context fits max_kv, the padded graphs' fewest-row shapes too: an H100's
    Llama-3.1-8B pool (413,282 slots) once got 209 rows of 2,048 tokens for the 224-row graph,
    and the profiler stopped on it."""
    from testbed.engine.cuda_graphs import graph_sizes
    from testbed.engine.profiler import device_grid
    for max_kv in (413_282, 100_000, 20_000):
        grid = device_grid(8192, 256, graph_sizes(256), max_kv=max_kv)
        assert grid and all(sum(sh.extend) + sum(sh.cached) <= max_kv for sh in grid)
    assert any(len(sh.extend) == 209 for sh in device_grid(8192, 256, graph_sizes(256), max_kv=1 << 20))


def test_the_profilers_schedulers_per_policy_fit_the_deployment():
    """Each host workload's policy: the run's as given, the others with its common knobs and their
    own at their defaults, cut to what a step of the deployment holds."""
    from testbed import assemble
    from testbed.config import compose
    cfg = compose(["scheduler.max_running=8", "scheduler.max_step_tokens=256", "policy.token_budget=64",
                   "policy.order=sjf"])
    make = assemble.scheduler_per_policy(cfg, assemble.model_spec(cfg))
    got = {n: make(n, 1000) for n in ("chunked", "prefill_first", "decode_first")}
    assert got["chunked"].policy.cfg is cfg.policy and got["chunked"].policy.cfg.token_budget == 64
    for name in ("prefill_first", "decode_first"):
        pcfg = got[name].policy.cfg
        assert (pcfg.name, pcfg.order, pcfg.max_prefill_tokens) == (name, "sjf", 256)
    assert all(s.cfg.limits.max_running == 8 and s.page_table.num_free_rows == 8 for s in got.values())


def test_serving_workload_and_idle_gaps():
    from testbed.engine.profiler import serving_workload
    from testbed.timeline.idle import idle_before
    reqs = serving_workload(400, 8.0, vocab=1000, max_context=2048, seed=3)
    arrivals = np.array([r.arrival for r in reqs])
    assert arrivals[0] == 0 and (np.diff(arrivals) > 0).all()
    assert 400 / arrivals[-1] == pytest.approx(8.0, rel=0.15)  # Poisson at the rate asked
    assert all(16 <= r.prompt_len and r.prompt_len + r.max_new_tokens <= 2048 and 8 <= r.max_new_tokens <= 1024
               for r in reqs)
    assert 300 < np.median([r.prompt_len for r in reqs]) < 1000
    # a step scheduled 5 ms after the last result was applied sat idle 5 ms; overlapped ones none
    idle = idle_before([0.0, 0.004, 0.020], [0.010, 0.012, 0.030], [0.001, 0.003, 0.001])
    assert idle == pytest.approx([0.0, 0.0, 0.005])


# ---------------------------------------------------------------------- the profiler on the CPU
@pytest.fixture(scope="module")
def cpu_profile(tmp_path_factory):
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("profile") / "cpu_smollm2.json"
    p = py("-m", "testbed.profile", *SMOL_CPU, "quick=true", "host_requests=8", "repeats=2", f"out={out}")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "device_decode" in p.stdout and f"written {out}" in p.stdout
    return out


@pytest.mark.slow
def test_profiler_writes_a_profile_the_simulator_uses(cpu_profile, tmp_path):
    from testbed.modelspec import load_model_spec
    from testbed.sim.costmodel import load_hardware
    from testbed.sim.costmodel.calibrated import CalibratedCostModel, load_profile
    prof = load_profile(cpu_profile)
    assert prof["engine"]["graph_sizes"] == [] and prof["machine"]["cpu_count"] >= 1
    assert set(prof["host"]) == {"all", "chunked", "prefill_first", "decode_first"}
    spec = load_model_spec("hf/smollm2_135m.json", name="smollm2_135m")
    cost = CalibratedCostModel(spec, load_hardware("h200"), profile=prof).step_cost([1, 1], [10, 20])
    assert min(cost.host, cost.launch, cost.device, cost.complete) > 0
    p = py("-m", "testbed.run", "model=smollm2_135m", "costmodel=calibrated", f"costmodel.profile={cpu_profile}",
           "trace=synthetic", "trace.num_requests=20", "progress=false", f"hydra.run.dir={tmp_path}")
    assert p.returncode == 0, p.stderr[-2000:]


def test_profiler_bad_input_is_one_line_error():
    p = py("-m", "testbed.profile", *SMOL_CPU, "repeats=0", timeout=120)
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].startswith("error: repeats=0 is invalid")
    p = py("-m", "testbed.profile", *SMOL_CPU, "engine.tp=2", timeout=120)
    assert p.returncode == 2 and "the profiler runs one rank" in p.stderr
    # these two are found before the served batches are simulated and the engine is built
    p = py("-m", "testbed.profile", *SMOL_CPU, "policies=chunked,bogus", timeout=120)
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1] == (
        "error: policies=chunked,bogus: 'bogus' is unknown; allowed: chunked, decode_first, prefill_first")
    assert "warm-up" not in p.stderr and "served batches" not in p.stderr
    p = py("-m", "testbed.profile", "model=qwen3_0_6b", "engine.device=cpu", timeout=120)
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].startswith("error: model.weights=real needs model.path")
    assert "served batches" not in p.stderr


# ---------------------------------------------------------------------- fidelity end to end
def cpu_plan(out: Path, profile: Path, n: int = 4) -> None:
    o = SMOL_CPU + ["policy=chunked", "trace=synthetic", f"trace.num_requests={n}", "trace.rate=20",
                    "trace.prompt_len_min=16", "trace.prompt_len_max=48", "trace.output_len_min=2",
                    "trace.output_len_max=6", "progress=false"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps([dict(
        name="smol-chunked-synthetic-light", model="smollm2_135m", policy="chunked", trace="synthetic", load="light",
        capacity_rps=80.0, rate_rps=20.0, num_requests=n, overrides=o, profile=str(profile))]))


@pytest.mark.slow
def test_fidelity_engine_report_and_check_on_the_cpu(cpu_profile, tmp_path):
    out = tmp_path / "fid"
    cpu_plan(out, cpu_profile)
    p = py("-m", "testbed.fidelity", "engine", f"out={out}", "repeats=2")
    assert p.returncode == 0, p.stderr[-3000:]
    for k in (1, 2):
        s = json.loads((out / "runs/smol-chunked-synthetic-light" / f"r{k}/summary.json").read_text())
        assert s["complete"] and s["metrics"]["completed"] == 4 and s["kv"]["warmup_s"] is not None
    machine = json.loads((out / "runs/smol-chunked-synthetic-light/machine.json").read_text())
    assert machine["cpu_count"] >= 1
    p = py("-m", "testbed.fidelity", "report", f"out={out}")
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((out / "fidelity.json").read_text())["cells"]["smol-chunked-synthetic-light"]
    e = res["errors"]["mean_ttft_ms"]
    assert len(e["engine"]) == 2 and e["sim"] > 0 and e["error"] == pytest.approx(e["sim"] / np.mean(e["engine"]) - 1)
    report = (out / "report.md").read_text()
    assert "| smol-chunked-synthetic-light |" in report
    assert f"one machine start, recorded at {machine['date']} (`runs/<cell>/machine.json`)" in report
    assert (out / "cdf_smollm2_135m_synthetic.png").read_bytes()[:4] == b"\x89PNG"
    assert py("-m", "testbed.fidelity", "check", f"out={out}").returncode == 0
    # a committed figure better than what the simulator now gives: check fails, naming the cell
    full = json.loads((out / "fidelity.json").read_text())
    full["cells"]["smol-chunked-synthetic-light"]["errors"]["mean_ttft_ms"]["error"] = 0.0
    (out / "fidelity.json").write_text(json.dumps(full))
    p = py("-m", "testbed.fidelity", "check", f"out={out}", "margin=0.001")
    assert p.returncode == 1 and "smol-chunked-synthetic-light mean_ttft_ms" in p.stdout
    # a planned cell not run yet: the report says so in a line and in its table, the run cell is reported
    plan = json.loads((out / "plan.json").read_text())
    (out / "plan.json").write_text(json.dumps(plan + [dict(plan[0], name="smol-chunked-synthetic-later")]))
    p = py("-m", "testbed.fidelity", "report", f"out={out}")
    assert p.returncode == 0 and "note: 1 of 2 cells have no engine run yet (reported as such): " \
        "smol-chunked-synthetic-later" in p.stderr
    assert "| smol-chunked-synthetic-later | no engine run |" in (out / "report.md").read_text()
    assert "errors" in json.loads((out / "fidelity.json").read_text())["cells"]["smol-chunked-synthetic-light"]


def test_fidelity_engine_builds_one_engine_per_model_and_engine_settings(monkeypatch, tmp_path):
    """Cells that share a model and engine settings share one warmed engine; a cell whose
    overrides change the engine (here its whole-step graphs) is not run on another's."""
    from testbed import assemble
    from testbed import run as run_module
    from testbed.fidelity.cells import Cell
    from testbed.fidelity.engine_side import run_engine_cells
    built, ran = [], []
    monkeypatch.setattr(assemble, "engine_parts",
                        lambda cfg: built.append((cfg.model.name, cfg.engine.overlap)) or len(built))
    monkeypatch.setattr(run_module, "run", lambda cfg, d, engine_parts, **kw: ran.append(engine_parts) or {
        "metrics": {"completed": 1, "duration_s": 1.0, "mean_ttft_ms": 1.0, "mean_tpot_ms": 1.0}})
    def cell(name, extra, model="smollm2_135m"):
        return Cell(name=name, model=model, policy="chunked", trace="synthetic", load="light", capacity_rps=1.0,
                    rate_rps=1.0, num_requests=1, overrides=SMOL_CPU + ["policy=chunked"] + extra + [f"model={model}"])
    cells = [cell("a", []), cell("b", []), cell("c", ["engine.overlap=true"]), cell("d", []),
             cell("e", [], model="qwen3_0_6b")]  # the same engine settings, another model
    assert run_engine_cells(cells, tmp_path, repeats=2) == []
    assert built == [("smollm2_135m", False), ("smollm2_135m", True), ("smollm2_135m", False), ("qwen3_0_6b", False)]
    assert ran == [1, 1, 1, 1, 2, 2, 3, 3, 4, 4]


def test_host_ratio_is_measured_host_time_over_the_profiles_fit():
    """The report's host-speed column: 1.0 for steps that took what the profile predicts."""
    import pandas as pd

    from testbed.fidelity.report import host_ratio
    from testbed.modelspec import load_model_spec, resolve_config_path
    from testbed.sim.costmodel.calibrated import CalibratedCostModel
    from testbed.sim.costmodel.hardware import load_hardware
    spec = load_model_spec(str(resolve_config_path("hf/qwen3_0_6b.json")), name="qwen3_0_6b")
    cost = CalibratedCostModel(spec, load_hardware("h200"), profile="h200_qwen3_0_6b", policy="chunked")
    steps = pd.DataFrame({"batch_reqs": [1, 8, 3, 40], "prefill_tokens": [300, 0, 512, 0],
                          "decode_tokens": [0, 8, 2, 40], "context_tokens": [300, 4000, 900, 30000]})
    p = cost.host_parts_arrays(steps["batch_reqs"], steps["prefill_tokens"] + steps["decode_tokens"],
                               steps["context_tokens"])
    for speed in (1.0, 1.7):
        steps["host_s"], steps["launch_s"] = speed * p["host_s"], speed * p["launch_s"]
        assert host_ratio(steps, cost) == pytest.approx(speed)
    assert host_ratio(steps.iloc[:0], cost) is None


def test_fidelity_engine_without_a_gpu_is_one_line_error(tmp_path):
    pytest.importorskip("torch")
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the committed plan would run")
    out = tmp_path / "fid"
    out.mkdir()
    (out / "plan.json").write_text((REPO / "benchmarks/results/fidelity/plan.json").read_text())
    p = py("-m", "testbed.fidelity", "engine", f"out={out}", "cells=llama3_8b-chunked-sharegpt-light", timeout=120)
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].startswith("error: engine.device=cuda but no CUDA")


def test_fidelity_bad_arguments(tmp_path):
    p = py("-m", "testbed.fidelity", "sweep", timeout=60)
    assert p.returncode != 0 and "step 'sweep' is unknown" in p.stderr
    p = py("-m", "testbed.fidelity", "report", "colour=blue", timeout=60)
    assert p.returncode != 0 and "argument 'colour=blue' is invalid" in p.stderr
    for step in ("report", "check", "engine"):  # no plan: one line, no traceback
        p = py("-m", "testbed.fidelity", step, f"out={tmp_path}", timeout=60)
        assert p.returncode != 0 and p.stderr.strip().splitlines() == [
            f"error: {tmp_path / 'plan.json'}: no plan; write one with `python -m testbed.fidelity plan out={tmp_path}`"]
    for arg, allowed in (("repeats=0", "an integer >= 1"), ("repeats=two", "an integer >= 1"),
                         ("margin=abc", "a number >= 0"), ("margin=-0.1", "a number >= 0")):
        p = py("-m", "testbed.fidelity", "check", f"out={tmp_path}", arg, timeout=60)
        k, v = arg.split("=")
        assert p.returncode != 0 and p.stderr.strip() == f"error: {k}={v!r} is invalid; allowed: {allowed}"
    cpu_plan(tmp_path, tmp_path / "p.json")
    p = py("-m", "testbed.fidelity", "report", f"out={tmp_path}", "cells=nothing", timeout=60)
    assert p.returncode != 0 and "matches no cell" in p.stderr
    # a plan whose cells have no engine runs: report says to run them, writes nothing
    p = py("-m", "testbed.fidelity", "report", f"out={tmp_path}", timeout=60)
    assert p.returncode != 0 and "no engine runs under" in p.stderr and "fidelity engine out=" in p.stderr
    assert not (tmp_path / "report.md").exists() and not (tmp_path / "fidelity.json").exists()
    p = py("-m", "testbed.fidelity", "check", f"out={tmp_path}", timeout=60)
    assert p.returncode != 0 and "no committed report to check against" in p.stderr
    # CI's guard fails when a committed cell's engine runs are gone, naming it (it compared nothing of it)
    (tmp_path / "fidelity.json").write_text(json.dumps({"cells": {"smol-chunked-synthetic-light": {
        "errors": {"mean_ttft_ms": {"error": 0.01}}}}}))
    p = py("-m", "testbed.fidelity", "check", f"out={tmp_path}", timeout=60)
    assert p.returncode == 1 and "smol-chunked-synthetic-light: the committed report has its errors but its " \
        "engine runs are missing" in p.stdout


def test_committed_report_matches_its_json():
    """The README's figures come from report.md; report.md from fidelity.json."""
    d = REPO / "benchmarks/results/fidelity"
    res = json.loads((d / "fidelity.json").read_text())["cells"]
    md = (d / "report.md").read_text()
    plan = json.loads((d / "plan.json").read_text())
    assert len(plan) == 30 and set(res) == {c["name"] for c in plan}
    for name, c in res.items():
        assert f"| {name} |" in md
        for k in ("mean_ttft_ms", "p90_tpot_ms", "output_throughput"):
            assert len(c["errors"][k]["engine"]) == 2  # every cell ran twice on the engine


def test_readme_figures_are_the_reports():
    """The README's fidelity table quotes report.md's median table, cell for cell."""
    import re
    readme = (REPO / "README.md").read_text()
    report = (REPO / "benchmarks/results/fidelity/report.md").read_text()
    for metric in ("mean TTFT", "p90 TTFT", "mean TPOT", "p90 TPOT", "mean E2E", "p90 E2E", "output throughput"):
        rep = re.search(rf"^\| {metric} \| ([\d.]+%) \| (\d+) of 30 \| ([\d.]+%) \|$", report, re.M)
        mine = re.search(rf"^\| {metric} \| ([\d.]+%) \| (\d+) \| ([\d.]+%) \|$", readme, re.M)
        assert rep and mine, metric
        assert rep.groups() == mine.groups(), (metric, rep.groups(), mine.groups())


def test_a_sample_of_an_unknown_pattern_is_refused():
    from testbed.sim.costmodel.fit import sample_batch
    d = {"kind": "decode", "pattern": "hooked", "reqs": 4, "extend": 1, "cached": 100}
    with pytest.raises(ValueError, match="'hooked'"):
        sample_batch(d)


def test_the_report_names_each_cells_machine_start(tmp_path):
    from testbed.fidelity.report import engine_starts
    (tmp_path / "runs/b").mkdir(parents=True)
    (tmp_path / "runs/c").mkdir()
    (tmp_path / "runs/machine.json").write_text('{"date": "D1"}')  # runs made before cells kept their own
    (tmp_path / "runs/b/machine.json").write_text('{"date": "D2"}')
    (tmp_path / "runs/d").mkdir()
    (tmp_path / "runs/d/machine.json").write_text('{"date": "D1"}')
    lines = engine_starts(tmp_path, ["a", "b", "c", "d"])
    assert lines == ["- engine runs of b: the machine start recorded at D2 (`runs/<cell>/machine.json`)",
                     "- engine runs of the other 3 cells: the machine start recorded at D1 (`runs/<cell>/machine.json`, "
                     "`runs/machine.json`)"]
    (tmp_path / "runs/machine.json").unlink()
    assert engine_starts(tmp_path, ["b"]) == ["- engine runs: one machine start, recorded at D2 (`runs/<cell>/machine.json`)"]
    assert any("? (no machine.json)" in line for line in engine_starts(tmp_path, ["a", "b"]))
    (tmp_path / "runs/b/machine.json").write_text('{"date": "D2", "gpu": "NVIDIA H100 80GB HBM3"}')
    assert engine_starts(tmp_path, ["b"]) == [
        "- engine runs: one machine start, recorded at D2 on NVIDIA H100 80GB HBM3 (`runs/<cell>/machine.json`)"]


def test_fidelity_plans_cells_for_another_gpu_from_its_profile(tmp_path):
    """hardware= plans the chosen cells on that GPU, each load a share of the capacity its own
    profile gives; a model without a profile there, or an unknown GPU, is one line."""
    cell = "qwen3_0_6b-chunked-sharegpt-light"
    p = py("-m", "testbed.fidelity", "plan", f"out={tmp_path / 'a'}", "hardware=h100", f"cells={cell}", timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    (c,) = json.loads((tmp_path / "a/plan.json").read_text())
    h200 = next(x for x in json.loads((REPO / "benchmarks/results/fidelity/plan.json").read_text()) if x["name"] == cell)
    assert c["name"] == cell and "hardware=h100" in c["overrides"] and "hardware=h200" not in c["overrides"]
    assert c["capacity_rps"] < 0.95 * h200["capacity_rps"]  # the H100's slower HBM, as its profile measured it
    p = py("-m", "testbed.fidelity", "plan", f"out={tmp_path / 'b'}", "hardware=a100",
           "cells=llama3_8b-chunked-sharegpt-light", timeout=300)
    assert p.returncode != 0 and p.stderr.strip().splitlines()[-1].startswith(
        "error: costmodel.profile='a100_llama3_8b': no such profile")
    p = py("-m", "testbed.fidelity", "plan", f"out={tmp_path / 'c'}", "hardware=tpu", timeout=300)
    assert p.returncode != 0 and p.stderr.strip().splitlines()[-1] == "error: hardware='tpu' is unknown; allowed: a100, h100, h200"
    p = py("-m", "testbed.fidelity", "report", f"out={tmp_path / 'a'}", "hardware=h100", timeout=300)
    assert p.returncode != 0 and p.stderr.strip() == ("error: hardware= goes with plan (a planned cell's overrides "
                                                      "name its hardware), not report")


def test_served_batches_round_trip_and_refuse_another_deployment(tmp_path):
    from testbed.profile import read_served, write_served
    dep = {"model": {"name": "m", "hidden_size": 64}, "engine": {"max_running": 4, "page_size": 1}}
    batches = [(np.array([300, 1, 1]), np.array([0, 40, 90])), (np.array([17, 1]), np.array([5, 2000]))]
    f = write_served(tmp_path / "served.json", dep, 150, batches)
    got = read_served(f, dep, 150)
    assert [(e.tolist(), c.tolist()) for e, c in got] == [(e.tolist(), c.tolist()) for e, c in batches]
    other = {**dep, "engine": {"max_running": 8, "page_size": 1}}
    with pytest.raises(ValueError, match=r"made for another deployment: engine.max_running: file 4, run 8$"):
        read_served(f, other, 150)
    with pytest.raises(ValueError, match="holds served=150; this profile asks served=20"):
        read_served(f, dep, 20)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a served_out= file"):
        read_served(tmp_path / "bad.json", dep, 150)


def test_served_out_writes_the_batches_without_a_gpu_and_served_from_checks_them(tmp_path):
    """The served batches are the simulator's (CPU work): made here, carried to the GPU machine."""
    f = tmp_path / "served.json"
    p = py("-m", "testbed.profile", *SMOL_CPU, f"served_out={f}", timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert f"written {f}: 0 served batches" in p.stdout  # torch attention: no fa2 plan to group them by
    assert json.loads(f.read_text())["deployment"]["engine"]["attention"] == "torch"
    p = py("-m", "testbed.profile", *SMOL_CPU, "scheduler.max_running=4", f"served_from={f}", timeout=300)
    assert p.returncode == 2 and "was made for another deployment: engine.max_running: file" in \
        p.stderr.strip().splitlines()[-1]
