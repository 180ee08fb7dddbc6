"""Roofline cost model: shape of the predictions, config validation, registry, speed."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import timeit
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from testbed.modelspec import load_model_spec
from testbed.sim.costmodel import (
    TERMS,
    CostModel,
    HardwareSpec,
    RooflineConfig,
    RooflineCostModel,
    COST_MODELS,
    available_hardware,
    load_hardware,
    make_cost_model,
)

REPO = Path(__file__).resolve().parents[1]


def spec(name):
    return load_model_spec(f"hf/{name}.json", name=name)


LLAMA8 = spec("llama3_8b")
LLAMA70 = spec("llama3_70b")
H200 = load_hardware("h200")


def cm8(**cfg) -> RooflineCostModel:
    return make_cost_model("roofline", LLAMA8, "h200", cfg)


def decode(b, ctx):
    return np.ones(b, dtype=np.int64), np.full(b, ctx, dtype=np.int64)


# ---------------------------------------------------------------------- hardware
def test_hardware_files():
    assert {"h200", "h100", "a100"} <= set(available_hardware())
    assert H200 == HardwareSpec("h200", 4.3e12, 790e12, 141e9, 450e9, 1e-5, 132)
    h100, a100 = load_hardware("h100"), load_hardware("a100")
    assert (h100.mem_bw, h100.flops, h100.mem_bytes, h100.link_bw) == (3.35e12, 989e12, 80e9, 450e9)
    assert (a100.mem_bw, a100.flops, a100.mem_bytes, a100.link_bw) == (2.039e12, 312e12, 80e9, 300e9)
    assert load_hardware(REPO / "conf/hardware/a100.yaml") == a100
    assert load_hardware(OmegaConf.create(dataclasses.asdict(a100))) == a100


def test_hardware_validation():
    with pytest.raises(ValueError, match=r"hardware.num_sms=-2 is invalid.*integer >= 0"):
        load_hardware({**dataclasses.asdict(H200), "num_sms": -2})
    with pytest.raises(ValueError, match=r"hardware.mem_bw=-1.*> 0"):
        HardwareSpec("x", -1, 1e12, 1e9, 1e9)
    with pytest.raises(ValueError, match=r"hardware='tpu9' is unknown.*h200"):
        load_hardware("tpu9")
    with pytest.raises(ValueError, match="unknown key"):
        load_hardware({"name": "x", "mem_bw": 1, "flops": 1, "mem_bytes": 1, "link_bw": 1, "bogus": 2})
    with pytest.raises(ValueError, match="missing"):
        load_hardware({"name": "x", "mem_bw": 1})


# ---------------------------------------------------------------------- predictions
def test_protocol_and_registry():
    cm = cm8()
    assert isinstance(cm, CostModel)
    assert {"auto", "calibrated", "roofline"} <= set(COST_MODELS.names())
    with pytest.raises(ValueError, match=r"costmodel.name='nope' is unknown.*roofline"):
        make_cost_model("nope", LLAMA8, "h200")


def test_registry_is_open():
    class Const:
        def __init__(self, s):
            self.s = s

        def step_time(self, n, c):
            return self.s

        def breakdown(self, n, c):
            return {"const": self.s}

    @dataclasses.dataclass
    class ConstConfig:
        seconds: float = 0.01

    @COST_MODELS.register("test_const", config=ConstConfig)
    def _make(spec, hw, cfg):
        return Const(cfg.seconds)

    cm = make_cost_model("test_const", LLAMA8, H200, {"name": "test_const", "seconds": 0.5})
    assert cm.step_time([1], [0]) == 0.5
    with pytest.raises(ValueError, match=r"unknown key.*\['seconds'\]"):
        make_cost_model("test_const", LLAMA8, H200, {"secs": 1})


def test_decode_batch1_is_weight_streaming():
    cm = cm8()
    t = cm.step_time(*decode(1, 1024))
    ideal = LLAMA8.weight_bytes() / H200.mem_bw  # ~16 GB / 4.3 TB/s ~ 3.7 ms
    assert 3.6e-3 < ideal < 3.8e-3
    body = t - cm.cfg.step_overhead_s
    assert 0.9 * ideal <= body <= ideal / cm.cfg.eff_mem
    b = cm.breakdown(*decode(1, 1024))
    assert b["linear"] > 10 * b["attention"]


def test_prefill_8k_is_compute_bound():
    cm = cm8()
    T = 8192
    ideal = 2 * LLAMA8.param_count() * T / H200.flops  # ~166 ms
    t = cm.step_time([T], [0])
    assert ideal < t < 1.5 * ideal
    # the linear term sits on the compute roof exactly
    p_lin = cm.linear_weight_bytes / LLAMA8.dtype_bytes
    lin = cm.breakdown([T], [0])["linear"]
    assert lin == pytest.approx(2 * p_lin * T / (H200.flops * cm.cfg.eff_compute), rel=1e-12)


def test_chunked_prefill_costs_at_least_one_shot():
    cm = cm8()
    one = cm.step_time([8192], [0])
    chunks = sum(cm.step_time([2048], [c]) for c in range(0, 8192, 2048))
    assert chunks >= one
    # attention of the chunks adds up to the one-shot attention (same causal pairs)
    att_one = cm.breakdown([8192], [0])["attention"]
    att_chunks = sum(cm.breakdown([2048], [c])["attention"] for c in range(0, 8192, 2048))
    assert att_chunks == pytest.approx(att_one, rel=1e-9)


def test_monotonic_in_batch_and_context():
    cm = cm8()
    by_batch = [cm.step_time(*decode(b, 1024)) for b in (1, 2, 8, 32, 64, 128, 256, 512)]
    assert all(a < b for a, b in zip(by_batch, by_batch[1:]))
    by_ctx = [cm.step_time(*decode(64, c)) for c in (0, 128, 1024, 4096, 32768)]
    assert all(a < b for a, b in zip(by_ctx, by_ctx[1:]))
    by_len = [cm.step_time([n], [0]) for n in (1, 16, 256, 1024, 8192)]
    assert all(a < b for a, b in zip(by_len, by_len[1:]))


batches = st.lists(
    st.tuples(st.integers(1, 4096), st.integers(0, 32768)), min_size=1, max_size=40
)


@settings(max_examples=200, deadline=None)
@given(batch=batches, extra=st.tuples(st.integers(1, 4096), st.integers(0, 32768)),
       idx=st.integers(0, 39), grow_n=st.integers(0, 512), grow_c=st.integers(0, 4096))
def test_more_work_never_takes_less_time(batch, extra, idx, grow_n, grow_c):
    for model in (cm8(), cm8(tp=4, per_request_overhead_s=1e-5)):
        n = np.array([b[0] for b in batch])
        c = np.array([b[1] for b in batch])
        t = model.step_time(n, c)
        # add a request
        assert model.step_time(np.append(n, extra[0]), np.append(c, extra[1])) >= t
        # grow one request's extend or context
        i = idx % len(n)
        n2, c2 = n.copy(), c.copy()
        n2[i] += grow_n
        c2[i] += grow_c
        assert model.step_time(n2, c2) >= t
        # breakdown always sums to step_time
        assert sum(model.breakdown(n, c).values()) == pytest.approx(t, rel=1e-12)


def test_breakdown_sums_to_step_time():
    for tp in (1, 2, 8):
        cm = make_cost_model("roofline", LLAMA70, "h200", {"tp": tp, "per_request_overhead_s": 2e-6})
        n = np.array([1] * 30 + [512, 2048])
        c = np.array(list(range(0, 3000, 100)) + [0, 4096])
        b = cm.breakdown(n, c)
        assert tuple(b) == TERMS
        assert all(v >= 0 for v in b.values())
        assert sum(b.values()) == cm.step_time(n, c)
        assert b["request_overhead"] == pytest.approx(32 * 2e-6)
        assert (b["allreduce"] > 0) == (tp > 1)


def test_tp8_faster_but_not_8x_at_small_decode():
    t1 = make_cost_model("roofline", LLAMA70, "h200", {"tp": 1})
    t8 = make_cost_model("roofline", LLAMA70, "h200", {"tp": 8})
    for b in (1, 8):
        a, z = t1.step_time(*decode(b, 1024)), t8.step_time(*decode(b, 1024))
        assert z < a < 8 * z
        assert t8.breakdown(*decode(b, 1024))["allreduce"] > 0.1 * z


def test_tp_shards_heads_and_replicates_kv():
    cm = make_cost_model("roofline", LLAMA70, "h200", {"tp": 8})
    assert cm.heads_per_rank == (8, 1)
    q = spec("qwen3_0_6b")  # 16 q heads, 8 kv heads
    cm16 = make_cost_model("roofline", q, "h200", {"tp": 16})
    assert cm16.heads_per_rank == (1, 1)  # kv heads replicated
    with pytest.raises(ValueError, match=r"engine.tp=3 .*allowed: \[1, 2, 4, 8"):
        make_cost_model("roofline", LLAMA8, "h200", {"tp": 3})


def test_batch_validation():
    cm = cm8()
    with pytest.raises(ValueError, match="empty batch"):
        cm.step_time(np.array([], dtype=np.int64), np.array([], dtype=np.int64))
    with pytest.raises(ValueError, match="empty batch"):
        cm.breakdown([], [])
    with pytest.raises(ValueError, match="differ in length"):
        cm.step_time([1, 1], [0])
    with pytest.raises(ValueError, match="extend_lens must be >= 1"):
        cm.step_time([0], [5])
    with pytest.raises(ValueError, match="cached_lens must be >= 0"):
        cm.step_time([1], [-1])
    with pytest.raises(ValueError, match="1-D"):
        cm.step_time(1, 5)
    # lists, int32 and int64 give the same answer
    n, c = [1, 7, 300], [10, 0, 900]
    ref = cm.step_time(np.array(n), np.array(c))
    assert cm.step_time(n, c) == ref
    assert cm.step_time(np.array(n, np.int32), np.array(c, np.int32)) == ref


@pytest.mark.parametrize(
    "key,value,allowed",
    [("eff_compute", 1.5, "(0, 1]"), ("eff_mem", 0, "(0, 1]"), ("eff_link", -0.1, "(0, 1]"),
     ("step_overhead_s", -1, ">= 0"), ("per_request_overhead_s", float("nan"), ">= 0"),
     ("tp", 0, ">= 1"), ("tp", 2.0, ">= 1")],
)
def test_config_validation(key, value, allowed):
    with pytest.raises(ValueError) as e:
        RooflineConfig(**{key: value})
    msg = str(e.value)
    setting = "engine.tp" if key == "tp" else f"costmodel.{key}"  # the TP degree is engine.tp's
    assert f"{setting}=" in msg and repr(value) in msg and allowed in msg
    with pytest.raises(ValueError, match="unknown key"):
        cm8(eff=0.5)


def test_yaml_mirrors_defaults():
    node = OmegaConf.to_container(OmegaConf.load(REPO / "conf/costmodel/roofline.yaml"))
    assert node.pop("name") == "roofline"
    assert node == {k: v for k, v in dataclasses.asdict(RooflineConfig()).items() if k != "tp"}  # tp: engine.tp
    cm = make_cost_model("roofline", LLAMA8, "h200", OmegaConf.load(REPO / "conf/costmodel/roofline.yaml"))
    assert cm.cfg == RooflineConfig()


def test_costmodel_tp_is_engine_tp():
    from testbed.assemble import cost_model
    from testbed.config import compose
    cfg = compose(["engine.tp=2"])
    assert cost_model(cfg, LLAMA8)[0].cfg.tp == 2
    with pytest.raises(ValueError, match="costmodel.tp=4 is not a setting; the TP degree is engine.tp"):
        cost_model(compose(["engine.tp=2", "+costmodel.tp=4"]), LLAMA8)


def test_every_model_and_hardware_builds():
    for name in ["llama3_8b", "llama3_70b", "qwen3_0_6b", "qwen3_8b", "qwen3_32b", "smollm2_135m"]:
        s = spec(name)
        for hw in ("h200", "h100", "a100"):
            cm = make_cost_model("roofline", s, hw)
            t = cm.step_time(*decode(4, 100))
            assert 0 < t < 1
    # slower hardware, slower steps
    t = {hw: make_cost_model("roofline", LLAMA8, hw).step_time([4096], [0]) for hw in ("h200", "a100")}
    assert t["a100"] > t["h200"]


def test_fast_enough():
    cm = cm8()
    rng = np.random.default_rng(0)
    n = np.ones(256, dtype=np.int64)
    c = rng.integers(0, 4096, 256)
    reps = 2000
    per_call = min(timeit.repeat(lambda: cm.step_time(n, c), number=reps, repeat=3)) / reps
    assert per_call < 100e-6  # ~10 us on a laptop-class core; loose to stay unflaky


def test_simulator_imports_no_torch():
    code = (
        "import sys, testbed.modelspec, testbed.sim.costmodel; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
