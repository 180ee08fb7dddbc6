"""Calibrated cost model: the committed step profiles, their predictions against the profiled
samples, the roofline fallback outside the profiled range, mismatch errors, costmodel=auto,
refitting a profile, and the CLI with costmodel=calibrated."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from testbed.modelspec import load_model_spec
from testbed.sim.costmodel import CostModel, StepCost, load_hardware, make_cost_model
from testbed.sim.costmodel.calibrated import (CalibratedConfig, CalibratedCostModel, available_profiles,
                                              load_profile, write_profile)
from testbed.sim.costmodel.fit import nnls_numpy, sample_batch

REPO = Path(__file__).resolve().parents[1]
PROFILE = "h200_qwen3_0_6b"
QWEN = load_model_spec("hf/qwen3_0_6b.json", name="qwen3_0_6b")
LLAMA8 = load_model_spec("hf/llama3_8b.json", name="llama3_8b")


def cm(spec=QWEN, **cfg) -> CalibratedCostModel:
    return make_cost_model("calibrated", spec, "h200", {"profile": f"h200_{spec.name}", **cfg})


def decode(b, ctx=1000):
    return np.ones(b, dtype=np.int64), np.full(b, ctx, dtype=np.int64)


# ---------------------------------------------------------------------- the committed profiles
@pytest.mark.parametrize("spec", [QWEN, LLAMA8], ids=lambda s: s.name)
def test_profile_records_where_and_how_it_was_measured(spec):
    name = f"h200_{spec.name}"
    assert name in available_profiles()
    p = load_profile(name)
    assert p["format"] == 2 and p["name"] == name
    assert p["model"]["name"] == spec.name and p["model"]["hidden_size"] == spec.hidden_size
    assert p["hardware"]["name"] == "h200" and p["machine"]["gpu"] == "NVIDIA H200"
    for key in ("driver", "torch", "flashinfer", "triton", "date", "cpu"):
        assert p["machine"][key], key
    e = p["engine"]
    assert e["tp"] == 1 and e["cuda_graph_max_bs"] == 256 and e["overlap"] is True and e["graph_sizes"][-1] == 256
    assert len(p["samples"]["device"]) > 150 and len(p["samples"]["host"]["host_s"]) > 1500
    assert set(p["host"]) == {"all", "chunked", "prefill_first", "decode_first"}


@pytest.mark.parametrize("spec", [QWEN, LLAMA8], ids=lambda s: s.name)
def test_device_predictions_reproduce_the_profiled_samples(spec):
    model = cm(spec)
    for kind, tol in (("decode", 0.05), ("prefill", 0.30), ("mixed", 0.15)):
        ds = [d for d in load_profile(f"h200_{spec.name}")["samples"]["device"] if d["kind"] == kind]
        pred = np.array([model.device_time(*sample_batch(d)) for d in ds])
        meas = np.array([d["device_s"] for d in ds])
        assert np.median(np.abs(pred / meas - 1)) < tol, kind


def test_graph_padding_and_eager_path():
    model = cm()
    sizes = model.sizes
    # a decode batch runs in the smallest captured graph that holds it, its padding rows included:
    # 17 rows of 32 tokens run in the 32-row graph, as 32 rows (15 of them empty) whose longest is 32
    t17, t32 = model.device_time(*decode(17, 31)), model.device_time(*decode(32, 16))  # 544 KV tokens each
    i = list(sizes).index(32)
    assert 17 not in sizes and t17 >= t32
    # the split-KV plan's features (decode_plan.py) of the padded batch: 17 rows of 32, 15 of 1
    load, tail = model._plan.features(np.r_[np.full(17, 32), np.ones(15, int)])
    assert tail > 0 and model._plan.features(np.full(32, 17)) == (model._plan.load(np.full(32, 17)), 0.0)
    assert t17 == pytest.approx(model._g_const[i] + model._g_slope[i] * 544 + model._g_third[i] * load
                                + model._g_tail[i] * tail)
    assert t32 == pytest.approx(model._g_const[i] + model._g_slope[i] * 544
                                + model._g_third[i] * model._plan.load(np.full(32, 17)))
    assert model.kind(*decode(256)) == "graph" and model.kind(*decode(257)) == "eager"
    assert model.kind([5, 1], [0, 10]) == "eager"
    # a prefill chunk costs more the longer it is and the more context it attends over
    short, long = model.device_time([64], [0]), model.device_time([4096], [0])
    assert long > short > 0
    assert model.device_time([512], [4096]) > model.device_time([512], [0])


def test_step_cost_parts_and_interface():
    model = cm()
    assert isinstance(model, CostModel)
    c = model.step_cost(*decode(32))
    assert isinstance(c, StepCost) and min(c.host, c.launch, c.device, c.complete) > 0
    assert model.step_time(*decode(32)) == c.device
    assert model.breakdown(*decode(32)) == {"host": c.host, "launch": c.launch, "device": c.device,
                                             "complete": c.complete}
    # host work grows with the batch; an eager step (a graph piece and an attention call per
    # layer) takes longer to launch than one decode graph, and far less than the ~11 ms the
    # kernel-by-kernel launch took on this model (benchmarks/results/piecewise)
    assert model.step_cost(*decode(200)).host > model.step_cost(*decode(2)).host
    assert 2 * model.step_cost(*decode(8)).launch < model.step_cost([512], [0]).launch < 5e-3
    # vectorised host parts agree with step_cost
    parts = model.host_parts_arrays([32, 1], [32, 512], [32032, 512])
    assert parts["host_s"][0] == pytest.approx(c.host) and parts["launch_s"][0] == pytest.approx(c.launch)
    assert parts["complete_s"][1] == pytest.approx(model.step_cost([512], [0]).complete)


def test_policy_host_fit_is_chosen_by_the_run_policy():
    a = cm(policy="prefill_first")
    b = cm(policy="chunked")
    assert a.policy == "prefill_first" and b.policy == "chunked"
    assert a.step_cost(*decode(64)).host != b.step_cost(*decode(64)).host
    assert cm(policy="my_own_policy").policy == "all"  # a policy the profile never ran: the pooled fit


def test_beyond_the_profiled_range_falls_back_to_the_roofline_with_one_warning():
    model = cm()
    rng = model.range
    ext, cac = np.array([rng["tokens"] + 1000]), np.array([0])
    from testbed.sim.costmodel.roofline import RooflineConfig, RooflineCostModel
    roof = RooflineCostModel(QWEN, load_hardware("h200"), RooflineConfig())
    with pytest.warns(UserWarning, match=r"prefill step of 1 requests, \d+ new tokens .* beyond the profiled range"):
        t = model.device_time(ext, cac)
    assert t == pytest.approx(roof.step_time(ext, cac))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per kind: the second is silent
        model.device_time(ext, cac)


def test_mismatched_model_hardware_or_tp_raises_naming_what_differs():
    with pytest.raises(ValueError) as e:
        make_cost_model("calibrated", LLAMA8, "h200", {"profile": PROFILE})
    msg = str(e.value)
    assert "model.hidden_size: profile 1024, run 4096" in msg and "testbed.profile" in msg
    with pytest.raises(ValueError, match="hardware.name: profile 'h200', run 'h100'"):
        make_cost_model("calibrated", QWEN, "h100", {"profile": PROFILE})
    with pytest.raises(ValueError, match="engine.tp: profile 1, run 2"):
        make_cost_model("calibrated", QWEN, "h200", {"profile": PROFILE, "tp": 2})
    with pytest.warns(UserWarning, match="measured on another deployment"):
        make_cost_model("calibrated", QWEN, "h200", {"profile": PROFILE, "tp": 2, "check": False})


def test_missing_or_bad_profile_raises(tmp_path):
    with pytest.raises(ValueError, match="no such profile.*allowed: a name in \\['h100_llama3_8b', 'h100_qwen3_0_6b', 'h200_llama3_8b', 'h200_qwen3_0_6b'"):
        make_cost_model("calibrated", QWEN, "h200", {"profile": "no_such_profile"})
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_profile(bad)
    prof = load_profile(PROFILE)
    prof.pop("_path")
    prof["format"] = 1
    write_profile(prof, bad)
    with pytest.raises(ValueError, match="format 1 is not supported; allowed: 2"):
        load_profile(bad)
    prof["format"] = 2
    prof["host"]["all"]["launch_eager"]["const"] = -1.0
    write_profile(prof, bad)
    with pytest.raises(ValueError, match="host.all.launch_eager has invalid entries"):
        load_profile(bad)
    with pytest.raises(ValueError, match="costmodel.check"):
        CalibratedConfig(check="yes")


def test_auto_picks_the_profile_of_the_pair_else_the_roofline():
    assert isinstance(make_cost_model("auto", QWEN, "h200", {}), CalibratedCostModel)
    assert isinstance(make_cost_model("auto", LLAMA8, "h200", {"policy": "chunked"}), CalibratedCostModel)
    assert isinstance(make_cost_model("auto", QWEN, "h100", {}), CalibratedCostModel)  # h100_qwen3_0_6b
    assert isinstance(make_cost_model("auto", LLAMA8, "h100", {}), CalibratedCostModel)  # h100_llama3_8b
    assert type(make_cost_model("auto", LLAMA8, "a100", {})).__name__ == "RooflineCostModel"
    assert type(make_cost_model("auto", QWEN, "h200", {"tp": 2})).__name__ == "RooflineCostModel"


def test_nnls_numpy_matches_scipy():
    rng = np.random.default_rng(1)
    a = np.abs(rng.normal(size=(200, 4)))
    x_true = np.array([2.0, 0.0, 0.5, 0.0])
    x = nnls_numpy(a, a @ x_true + rng.normal(scale=1e-3, size=200))
    assert (x >= 0).all() and np.allclose(x, x_true, atol=1e-2)
    sp = pytest.importorskip("scipy.optimize")
    for _ in range(50):
        a, b = rng.normal(size=(30, 5)), rng.normal(size=30)
        x1, x2 = sp.nnls(a, b)[0], nnls_numpy(a, b)
        assert (x2 >= 0).all() and np.linalg.norm(a @ x2 - b) <= np.linalg.norm(a @ x1 - b) + 1e-9


def _close(a, b, rel=1e-9) -> bool:
    """a == b, floats within rel of each other (dicts and lists compared item by item)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_close(a[k], b[k], rel) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_close(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=rel,
                                                                                            abs_tol=1e-300)
    return a == b


def test_refit_reproduces_the_committed_profile(tmp_path):
    out = tmp_path / "q.json"
    p = subprocess.run([sys.executable, "-m", "testbed.profile", f"refit={PROFILE_PATH}", f"out={out}"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    new, old = json.loads(out.read_text()), load_profile(PROFILE)
    # the same fit of the same samples; another numpy / BLAS build rounds the least squares'
    # last bits differently
    assert _close(new["host"], old["host"]) and _close(new["device"], old["device"])
    assert new["engine"] == old["engine"] and new["policy"] == old["policy"]  # the deployment it records
    assert new["samples"]["local"] == old["samples"]["local"]  # other starts' mixed shapes stay with it
    assert "device_decode" in p.stdout and "chunked_launch_s" in p.stdout
    p = subprocess.run([sys.executable, "-m", "testbed.profile", f"refit={tmp_path / 'none.json'}"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stderr.startswith("error:")


PROFILE_PATH = REPO / "testbed/sim/costmodel/profiles" / f"{PROFILE}.json"


def test_refit_takes_the_decode_graph_shapes_from_graph_from(tmp_path):
    """The committed Qwen3-0.6B profile is its own grid with the CUDA-graph decode shapes of a
    re-measured one and served graph steps of another start: refit with graph_from= and
    graph_samples_from= makes it again, and only its graph part moves."""
    other = REPO / "benchmarks/results/decode/h200_qwen3_0_6b_pending_ids.json"
    served = REPO / "benchmarks/results/fidelity/missing_cells_start6/served_graphs.json"
    out = tmp_path / "g.json"
    p = subprocess.run([sys.executable, "-m", "testbed.profile", f"refit={PROFILE_PATH}", f"graph_from={other}",
                        f"graph_samples_from={served}", f"out={out}"], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    new, old, g = json.loads(out.read_text()), load_profile(PROFILE), json.loads(other.read_text())
    assert _close(new["device"], old["device"]) and _close(new["host"], old["host"])
    top = max(g["engine"]["graph_sizes"])
    keys = ("kind", "pattern", "reqs", "extend", "cached", "device_s")
    graph = lambda samples: sorted(json.dumps([d.get(k) for k in keys]) for d in samples  # noqa: E731
                                   if d["kind"] == "decode" and d["reqs"] <= top)
    steps = json.loads(served.read_text())
    as_fitted = [d | {"device_s": round(d["device_s"], 7)} for d in steps["samples"]["device"]]  # fit.round_samples
    assert graph(new["samples"]["device"]) == sorted(graph(g["samples"]["device"]) + graph(as_fitted))
    assert [m["date"] for m in new["graph_machines"]] == [g["machine"]["date"]]
    assert [m["date"] for m in new["graph_sample_machines"]] == [steps["machine"]["date"]]
    p = subprocess.run([sys.executable, "-m", "testbed.profile", f"graph_from={other}"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "go with refit=PATH" in p.stderr


def test_a_fresh_profile_on_cuda_fits_the_fa2_plan_with_the_default_attention():
    """engine.attention's default (null) is flashinfer on CUDA: its prefill plan is a feature of the fit."""
    from testbed.config import EngineConfig
    from testbed.modelspec import load_model_spec
    from testbed.sim.costmodel.fit import fa2_shape
    spec = load_model_spec("hf/llama3_8b.json", name="llama3_8b")
    assert fa2_shape(spec, EngineConfig(), 132) == fa2_shape(spec, EngineConfig(attention="flashinfer"), 132)
    assert fa2_shape(spec, EngineConfig(), 132) is not None
    assert fa2_shape(spec, EngineConfig(device="cpu"), 132) is None
    assert fa2_shape(spec, EngineConfig(prefill_backend="fa3"), 132) is None


def test_a_profile_records_the_limits_and_policy_it_was_measured_with():
    """Its engine section the deployment's limits, the policy beside; a profile fitted while the
    limits were policy knobs is read as the deployment it was."""
    from testbed.profile import recorded_limits_and_policy
    e = load_profile(PROFILE)["engine"]
    assert (e["max_running"], e["max_step_tokens"]) == (256, 8192) and "token_budget" not in e
    assert recorded_limits_and_policy(load_profile(PROFILE))[:4] == [
        "scheduler.max_running=256", "scheduler.max_step_tokens=8192", "policy=chunked", "policy.order=fcfs"]
    before = {"engine": {"max_running": 64, "max_prefill_tokens": 4096, "token_budget": 256}}
    assert recorded_limits_and_policy(before) == ["scheduler.max_running=64", "scheduler.max_step_tokens=4096",
                                                  "policy=chunked", "policy.token_budget=256"]


# ---------------------------------------------------------------------- CLI
def run_cli(tmp_path, *overrides):
    return subprocess.run([sys.executable, "-m", "testbed.run", *overrides, "progress=false",
                           f"hydra.run.dir={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_cli_runs_with_calibrated(tmp_path):
    p = run_cli(tmp_path, "costmodel=calibrated", f"costmodel.profile={PROFILE}", "model=qwen3_0_6b",
                "trace.num_requests=100", "policy=decode_first")
    assert p.returncode == 0, p.stderr[-2000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["metrics"]["completed"] == 100 and "host fit=decode_first" in s["kv"]["cost_model"]
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert (steps[["host_s", "launch_s", "complete_s", "duration_s"]] > 0).all().all()
    # the simulated timeline holds the host's parts: a step never ends before its host work is done
    assert (steps["end_s"] - steps["start_s"] >= steps["host_s"] + steps["launch_s"] - 1e-12).all()


def test_cli_mismatch_is_one_line_error(tmp_path):
    p = run_cli(tmp_path, "costmodel=calibrated", f"costmodel.profile={PROFILE}", "trace.num_requests=10")  # llama3_8b
    assert p.returncode == 2
    assert "error: costmodel.profile='h200_qwen3_0_6b'" in p.stderr and "model.name: profile 'qwen3_0_6b'" in p.stderr


def test_cli_calibrated_takes_the_pairs_profile_or_says_there_is_none(tmp_path):
    """costmodel=calibrated without a profile: the one of the run's hardware and model (it was
    always Qwen3-0.6B's, refused for the default model)."""
    p = run_cli(tmp_path / "a", "costmodel=calibrated", "trace.num_requests=10")  # default: llama3_8b on h200
    assert p.returncode == 0, p.stderr[-2000:]
    assert "profile=h200_llama3_8b" in json.loads((tmp_path / "a" / "summary.json").read_text())["kv"]["cost_model"]
    p = run_cli(tmp_path / "b", "costmodel=calibrated", "model=qwen3_8b", "trace.num_requests=10")
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].startswith(
        "error: costmodel=calibrated: no profile of hardware=h200 and model=qwen3_8b is shipped (profiles: [")


# ---------------------------------------------------------------------- engine behaviour the model knows
def test_eager_steps_pad_to_the_piecewise_graph_sizes():
    from testbed.sim.costmodel.fit import padded_tokens
    assert padded_tokens([16, 32, 48], [1, 16, 17, 48, 49]).tolist() == [16, 16, 32, 48, 49]
    assert padded_tokens([], [5]).tolist() == [5]
    model = cm()
    sizes = model.profile["device"]["eager"]["piece_sizes"]
    assert sizes and 17 not in sizes and 32 in sizes  # the committed profile ran with piecewise graphs
    # one fresh prompt of 17 tokens runs in the 32-token graph: as long as 32 tokens (attention aside)
    assert model.device_time([17], [0]) == pytest.approx(model.device_time([32], [0]), rel=0.02)
    assert model.device_time([33], [0]) > model.device_time([32], [0])


def test_a_padded_prompt_attends_over_its_own_tokens_only():
    """The padding rows run the linear layers, not attention: a 5,170-token prompt in the
    5,632-token graph is priced under the 5,632-token prompt the base curve measured (on the
    H200 the fidelity runs' 5,170-token prompts took 22.45 ms, the profile's 5,632 24.24 ms)."""
    from testbed.sim.costmodel.eager_batch import EagerBatch
    from testbed.sim.costmodel.fit import eager_extras
    model = cm()
    assert 5170 not in model.profile["device"]["eager"]["piece_sizes"]
    full, padded = model.device_time([5632], [0]), model.device_time([5170], [0])
    assert padded < 0.95 * full
    assert padded > model.device_time([5120], [0])  # the linear layers still run 5,632 rows
    x = eager_extras([5170], [0], model._fa2, base=5632)
    assert x[0] == EagerBatch([5170], [0]).attn_work() - 5632 * 5633 / 2 < 0  # less attention than the base prompt's
    assert (eager_extras([5170], [0], model._fa2) == 0).all()  # against its own tokens: nothing extra


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.just(1), st.integers(1, 3000)), st.integers(0, 40000)), min_size=1,
                max_size=80),
       st.sampled_from([(2, 8), (4, 8), (1, 1), (8, 2)]), st.sampled_from([1, 16]))
def test_fa2_plan_splits_kv_as_flashinfer_documents(rows, heads, page):
    from testbed.sim.costmodel.fit import Fa2Shape, fa2_plan
    n, c = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
    fa = Fa2Shape(group=heads[0], kv_heads=heads[1], num_sms=132, page_size=page)
    tile, chunk, items = fa2_plan(n, c, fa)
    avg = int((n * fa.group).sum()) // len(n)
    assert tile == (128 if avg > 64 else 64 if avg > 16 else 16)
    tiles = -(-(n * fa.group) // tile)
    kv = np.maximum(-(-(n + c) // page), 1)
    limit = max(1, 2 * 132 // fa.kv_heads)
    cpages = chunk // page
    assert chunk % page == 0 and items == int((tiles * -(-kv // cpages)).sum())
    if tiles.sum() <= limit:  # splittable: the smallest chunk (at least 128 tokens) that keeps within the limit
        assert items <= limit
        smaller = cpages - 1
        assert cpages == max(128 // page, 1) or int((tiles * -(-kv // smaller)).sum()) > limit
    else:  # too many query tiles: no split
        assert cpages >= kv.max()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.just(1), st.integers(1, 8192)), st.integers(0, 131072)), min_size=1,
                max_size=300),
       st.sampled_from([(2, 8), (4, 8), (8, 2)]))
def test_integer_sums_give_the_float_sums_exactly(rows, heads):
    """The eager price's terms (EagerBatch) sum integer batches in ints, the decode rows' parts in
    closed form: the very floats of their float definitions, array by array (the simulator's step
    times, and so its files, stay bit for bit)."""
    from testbed.sim.costmodel.eager_batch import EagerBatch
    from testbed.sim.costmodel.fit import FA2_TILES, Fa2Shape, fa2_load, fa2_plan, local_features
    n, c = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
    nf, cf = n.astype(float), c.astype(float)
    b = EagerBatch(n, c)
    assert b.attn_work() == float((nf * (cf + (nf + 1) / 2)).sum())
    assert b.imbalance() == float(len(n) * (n + c).max() - (n + c).sum())
    fa = Fa2Shape(group=heads[0], kv_heads=heads[1], num_sms=132)
    tile, chunk, items = plan = fa2_plan(n, c, fa)
    q = max(tile // fa.group, 1)
    k = -(-n // q)
    spread = float((k * c + q * k * (k + 1) // 2 - (k * q - n)).sum()) * fa.kv_heads / fa.num_sms
    blocks = items * fa.kv_heads
    load = max(chunk * min(2, -(-blocks // 132)), spread) if blocks <= 2 * 132 else spread + chunk
    assert fa2_load(n, c, fa, plan).tolist() == [load if t == tile else 0.0 for t in FA2_TILES]
    fresh = fa2_load([4096], [0], fa)
    head = [float((nf * (cf + (nf + 1) / 2)).sum()) - 4096 * 4097 / 2, float(c.sum()), len(n) - 1.0,
            float(len(n) * (n + c).max() - (n + c).sum())]
    want = head + ([0.0] * 3 if n.sum() == len(n) else (fa2_load(n, c, fa, plan) - fresh).tolist())
    assert b.extras(fa, 4096).tolist() == want
    g, x = local_features(n, c, fa)
    assert g == (tile, blocks <= 2 * 132) and x.tolist() == [
        math.log2(int(n.sum())), math.log2(1 + int((n == 1).sum())), math.log2(1 + int(c.sum())), math.log2(1 + load)]


def test_host_scale_multiplies_host_times_only():
    base, slow = cm(), cm(host_scale=1.5)
    for shape in (decode(32), ([300, 1, 1], [0, 500, 900])):
        a, b = base.step_cost(*shape), slow.step_cost(*shape)
        assert b.device == a.device
        for part in ("host", "launch", "complete"):
            assert getattr(b, part) == pytest.approx(1.5 * getattr(a, part))
    for bad in (0, -1.0, float("nan"), True, "fast"):
        with pytest.raises(ValueError, match="costmodel.host_scale"):
            cm(host_scale=bad)


def test_median_nnls_fits_the_typical_step_through_outliers():
    """A fifth of the steps 2-5x slower (a slow stretch, GC pauses): the fit stays on the rest."""
    from testbed.sim.costmodel.fit import median_nnls
    rng = np.random.default_rng(0)
    x = np.column_stack([np.ones(400), rng.integers(1, 256, 400).astype(float)])
    y = x @ np.array([3e-4, 2e-6]) * rng.normal(1.0, 0.01, 400)
    slow = rng.random(400) < 0.2
    y[slow] *= rng.uniform(2, 5, slow.sum())
    assert median_nnls(x, y) == pytest.approx([3e-4, 2e-6], rel=0.03)


def test_host_fit_takes_woken_steps_apart_as_wake_factors():
    from testbed.sim.costmodel.fit import WAKE_GAP_S, fit_host, predict_host_parts
    rng = np.random.default_rng(1)
    rows = []
    for i in range(600):
        b = int(rng.integers(1, 64))
        prefill = i % 5 == 0
        tok = int(rng.integers(16, 512)) if prefill else b
        woken = i % 7 == 0
        h, l = 3e-4 + 2e-6 * b + (1e-7 * tok if prefill else 0), 4e-4 + 1e-6 * b + (2e-6 * tok if prefill else 0)
        rows.append({"batch_reqs": b, "prefill_reqs": int(prefill), "prefill_tokens": tok if prefill else 0,
                     "decode_tokens": 0 if prefill else b, "context_tokens": 1000 * b, "duration_s": 1e-3,
                     "host_s": h * (2.5 if woken else 1.0), "launch_s": l * (1.5 if woken else 1.0),
                     "complete_s": 5e-5, "idle_s": 0.01 if woken else 0.0})
    fits = fit_host(rows, max_graph=64)
    assert fits["wake"] == pytest.approx({"gap_s": WAKE_GAP_S, "host": 2.5, "launch": 1.5}, rel=0.02)
    awake = [r for r in rows if not r["idle_s"]]
    p = predict_host_parts(fits, [r["batch_reqs"] for r in awake],
                           [r["prefill_tokens"] + r["decode_tokens"] for r in awake],
                           [r["context_tokens"] for r in awake], 64)
    assert p["host_s"] == pytest.approx([r["host_s"] for r in awake], rel=0.02)
    # workloads without idle gaps (a profile of before December 2026) have no wake fit
    assert "wake" not in fit_host([dict(r, idle_s=0.0) for r in rows], max_graph=64)


def test_device_wake_is_the_median_excess_of_woken_single_prompts():
    """A woken step's device time over the device model's, as a constant: the median over the
    woken steps of one prompt and no decodes (their batch is exact); busy steps, steps of
    several requests and steps with decodes do not count; too few such steps: none."""
    from testbed.sim.costmodel.fit import WAKE_MIN_STEPS, fit_device_wake

    class Model:
        @staticmethod
        def device_time(extend, cached):
            return 1e-3 + 2e-6 * extend[0] + 1e-7 * cached[0]

    def row(tok, cached, extra, idle=0.01, reqs=1, decodes=0):
        return {"batch_reqs": reqs, "prefill_reqs": 1, "prefill_tokens": tok, "decode_reqs": decodes,
                "context_tokens": tok + cached, "idle_s": idle,
                "duration_s": Model.device_time([tok], [cached]) + extra}
    rows = [row(64 * (i + 1), 100 * i, 9e-4 + (1e-4 if i % 2 else -1e-4) * (i % 3)) for i in range(11)]
    noise = [row(512, 0, 5e-3, idle=0.0), row(512, 0, 5e-3, reqs=3), row(512, 0, 5e-3, reqs=2, decodes=1)] * 5
    extra, n = fit_device_wake(rows + noise, Model)
    assert n == 11 and extra == pytest.approx(9e-4, abs=1e-5)
    assert fit_device_wake(rows[:WAKE_MIN_STEPS - 1] + noise, Model) is None


def test_a_woken_step_takes_the_profiles_device_wake_in_the_simulator():
    """The committed Qwen3-0.6B profile's wake through the executor: a step launched after an
    idle gap runs its device time plus the wake's device_s; one launched while busy does not (the
    device busy until t=10: both start then)."""
    from testbed.sim.executor import SimExecutor
    model = cm()
    gap, _, _, device_s = model.wake
    assert 3e-4 < device_s < 3e-3  # 0.88 ms measured (testbed/sim/costmodel/fit.py says how)
    ex = SimExecutor(model, now=lambda: 0.0)
    c = model.step_cost(np.array([256]), np.array([0]))
    busy = ex.place(1.0, c.host, c.launch, c.device, c.complete, device_free=10.0, applied=1.0)
    woken = ex.place(1.0, c.host, c.launch, c.device, c.complete, device_free=10.0, applied=1.0 - 2 * gap)
    assert busy[3] == pytest.approx(c.device) and woken[3] == pytest.approx(c.device + device_s)


def test_whole_step_graph_steps_get_their_own_launch_fit_and_the_model_uses_it():
    """A profile measured with engine.whole_step_graphs: the eager steps its rule takes (the
    engine's rule, fit.WholeStepRule) launch at their own cost, the others at the eager one."""
    from testbed.sim.costmodel.calibrated import load_profile
    from testbed.sim.costmodel.fit import WholeStepRule, fit_host
    prof = json.loads(json.dumps(load_profile(PROFILE), default=str))
    pieces = prof["device"]["eager"]["piece_sizes"]
    rule = WholeStepRule(tuple(s for s in pieces if s <= 1024), (2, 4, 8, 16), QWEN.num_q_heads // QWEN.num_kv_heads)
    rng = np.random.default_rng(2)
    rows = []
    for i in range(900):
        b = int(rng.integers(1, 40))
        prefill = i % 3 == 0
        tok = int(rng.integers(b + 1, 2048)) if prefill else b
        whole = prefill and rule.graph(tok, b) is not None
        launch = 5e-4 + 2e-5 * b if whole else (1.5e-3 + 1e-5 * b + 1e-6 * tok if prefill else 2e-4)
        rows.append({"batch_reqs": b, "prefill_reqs": int(prefill), "prefill_tokens": tok - b if prefill else 0,
                     "decode_tokens": b, "context_tokens": 500 * b + tok, "duration_s": 1e-3,  # tokens: both
                     "host_s": 3e-4, "launch_s": launch, "complete_s": 5e-5, "idle_s": 0.0})
    fits = fit_host(rows, max_graph=64, whole=rule)
    assert fits["launch_whole"] == pytest.approx({"const": 5e-4, "reqs": 2e-5}, rel=0.02)
    assert fits["launch_eager"]["const"] == pytest.approx(1.5e-3, rel=0.02)
    prof["engine"]["whole_step_graphs"] = {"max_tokens": 1024, "slots": [2, 4, 8, 16]}
    prof["host"] = {"all": fits}
    model = CalibratedCostModel(QWEN, load_hardware("h200"), profile=prof)
    taken, untaken = [500, 1, 1, 1], [1500, 1, 1]  # a chunk beside 3 decodes; one beyond the graphs' tokens
    assert rule.graph(503, 4) and not rule.graph(1502, 3)
    assert model.step_cost(taken, [0, 90, 90, 90]).launch == pytest.approx(5e-4 + 2e-5 * 4, rel=0.02)
    assert model.step_cost(untaken, [0, 90, 90]).launch == pytest.approx(1.5e-3 + 3e-5 + 1.502e-3, rel=0.02)
    parts = model.host_parts_arrays([4, 3], [503, 1502], [773, 1772])
    assert parts["launch_s"] == pytest.approx([5e-4 + 8e-5, 1.5e-3 + 3e-5 + 1.502e-3], rel=0.02)
    del prof["host"]["all"]["launch_whole"]
    with pytest.raises(ValueError, match="no host.all.launch_whole fit"):
        CalibratedCostModel(QWEN, load_hardware("h200"), profile=prof)


def test_device_grids_of_several_starts_pool_to_the_median_per_shape():
    from testbed.sim.costmodel.fit import pool_device_samples
    shape = {"kind": "decode", "pattern": "uniform", "reqs": 8, "tokens": 8, "kv_tokens": 4096, "extend": 1,
             "cached": 511}
    other = dict(shape, reqs=16, tokens=16, kv_tokens=8192)
    t = lambda x: {"prep_s": x, "launch_s": x, "free_s": x, "device_s": x}  # noqa: E731
    pooled = pool_device_samples([[shape | t(1.0), other | t(5.0)], [shape | t(2.0)], [shape | t(9.0)]])
    assert [p["reqs"] for p in pooled] == [8, 16]
    assert pooled[0]["device_s"] == 2.0 and pooled[0]["device_s_by_start"] == [1.0, 2.0, 9.0]
    assert pooled[1]["device_s"] == 5.0 and pooled[1]["device_s_by_start"] == [5.0]


# ---------------------------------------------------------------------- the local correction
def test_local_correction_is_the_near_shapes_residual_and_none_far_from_them():
    from testbed.sim.costmodel.fit import Fa2Shape, LocalCorrection, local_features
    fa = Fa2Shape(group=2, kv_heads=8, num_sms=132, page_size=1)
    chunk = lambda decodes, ctx: ([496] + [1] * decodes, [3000] + [ctx] * decodes)  # noqa: E731
    shapes = [chunk(16, 12000), chunk(17, 12000), chunk(16, 20000)]
    res = np.log([1.10, 1.12, 0.95])
    groups = {local_features(*b, fa)[0] for b in shapes}
    assert len(groups) == 1
    places = np.array([local_features(*b, fa)[1] for b in shapes])
    lc = LocalCorrection({groups.pop(): (places, res)}, fa, k=2, radius=0.4, soften=0.3)
    # at a measured shape: its own residual and its nearest neighbour's, weighted by closeness
    d = np.sqrt(((places - places[0]) ** 2).sum(axis=1))
    near = np.argsort(d)[:2]
    w = 1 / (d[near] + 0.3)
    assert lc.factor(*shapes[0]) == pytest.approx(math.exp((w * res[near]).sum() / w.sum()))
    assert 1.10 < lc.factor(*shapes[0]) < 1.12
    # far from every measured shape: none (a longer chunk in the same group, or another query
    # tile: a short chunk beside 100 decodes)
    assert lc.factor([1400] + [1] * 16, [3000] + [12000] * 16) == 1.0
    other = ([64] + [1] * 100, [0] + [500] * 100)
    assert local_features(*other, fa)[0] != local_features(*shapes[0], fa)[0] and lc.factor(*other) == 1.0


def test_the_committed_profile_corrects_mixed_steps_only():
    """Its mixed steps near a measured shape are priced by that shape's residual; prefill and
    decode steps keep the fit's price."""
    model = cm()
    assert model._local is not None and len(model._local.residuals) > 400
    plain = CalibratedCostModel(QWEN, load_hardware("h200"), profile={
        **{k: v for k, v in load_profile(PROFILE).items() if k != "device"},
        "device": {**load_profile(PROFILE)["device"], "eager": {
            k: v for k, v in load_profile(PROFILE)["device"]["eager"].items() if k != "local"}}})
    assert plain._local is None
    for batch in (([2048], [0]), ([512] * 4, [1024] * 4), decode(64, 700)):
        assert model.device_time(*batch) == plain.device_time(*batch)
    # at the measured shapes the prices move toward their times (another start's measurement
    # of a shape may lie a few percent from this one's: not each shape, the typical one)
    local = load_profile(PROFILE)["samples"]["local"][::5]
    err, err0 = (np.array([abs(m.device_time(*sample_batch(d)) / d["device_s"] - 1) for d in local])
                 for m in (model, plain))
    assert (err != err0).mean() > 0.9 and np.median(err) < 0.5 * np.median(err0)


def test_refit_with_local_from_keeps_the_eager_fit_and_adds_the_other_starts_mixed_shapes(tmp_path):
    other = REPO / "benchmarks/results/fidelity/start17/profile_start17_h200_qwen3_0_6b.json"
    base = tmp_path / "base.json"
    old = load_profile(PROFILE)
    write_profile({**{k: v for k, v in old.items() if k != "local_machines"},
                   "samples": {k: v for k, v in old["samples"].items() if k != "local"}}, base)
    out = tmp_path / "l.json"
    p = subprocess.run([sys.executable, "-m", "testbed.profile", f"refit={base}", f"local_from={other},{other}",
                        f"out={out}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    new = json.loads(out.read_text())
    theirs = [d for d in json.loads(other.read_text())["samples"]["device"] if d["kind"] == "mixed"]
    assert len(new["samples"]["local"]) == len(theirs)  # named twice, kept once
    assert {d["start"] for d in new["samples"]["local"]} == {other.stem}
    assert new["local_machines"] == [json.loads(other.read_text())["machine"]]
    assert _close(new["device"]["eager"]["coef_s"], old["device"]["eager"]["coef_s"])  # the fit: the own grid's
    assert new["device"]["eager"]["local"] == {"k": 3, "radius": 0.4, "soften": 0.3}
    p = subprocess.run([sys.executable, "-m", "testbed.profile", f"local_from={other}"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "go with refit=PATH" in p.stderr
