"""The engine driven by the scheduler, end to end through the CLI on the CPU: greedy token
ids equal HF transformers' greedy generate, through chunked prefill, prefix-cache hits,
preemption, page sizes and overlap on or off."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from engine_fixtures import hf_greedy, prompt_file, run_engine, save_tiny_model

pytestmark = pytest.mark.slow  # the CPU engine's golden runs

N_NEW = 10


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model_and_reference(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    model_dir = save_tiny_model(request.param, d / "model")
    trace = d / "prompts.csv"
    prompts = prompt_file(trace, out_tokens=N_NEW)
    return model_dir, trace, hf_greedy(model_dir, prompts, N_NEW)


SCENARIOS = {
    # name: (overrides, what must have happened)
    "chunked_prefix_overlap": (["policy.token_budget=32"], ("chunks", "prefix")),
    "preempt_page4": (["policy=prefill_first", "engine.page_size=4", "engine.num_pages=60", "policy.reserve=estimate"],
                      ("preempt", "prefix")),
    "preempt_sync": (["policy.token_budget=32", "engine.num_pages=250", "policy.reserve=estimate",
                      "engine.overlap=false"], ("preempt", "chunks")),
    "no_cache_sjf": (["cache=none", "policy.order=sjf", "policy=decode_first", "engine.cpu_threads=1"], ("one_thread",)),
    # the fused Triton kernels (CPU interpreter here, tests/conftest.py) in place of torch ops
    "triton_kernels": (["engine.kernels=triton", "policy.token_budget=32"], ("chunks", "prefix", "triton")),
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_greedy_ids_equal_hf_generate(model_and_reference, tmp_path, scenario):
    model_dir, trace, expected = model_and_reference
    overrides, needs = SCENARIOS[scenario]
    p = run_engine(model_dir, trace, tmp_path, *overrides)
    assert p.returncode == 0, p.stderr[-3000:]
    req = pd.read_parquet(tmp_path / "requests.parquet").sort_values("rid")
    assert set(req["state"]) == {"FINISHED"}
    assert [list(x) for x in req["output_ids"]] == expected
    if "chunks" in needs:
        assert (req["prefill_chunks"] > 1).any()
    if "prefix" in needs:
        assert req["prefix_cached_tokens"].sum() > 0
    if "preempt" in needs:
        assert req["preemptions"].sum() > 0
    if "triton" in needs:
        pytest.importorskip("triton")
        assert json.loads((tmp_path / "summary.json").read_text())["kv"]["kernels"] == "triton"
    kv = json.loads((tmp_path / "summary.json").read_text())["kv"]
    if "one_thread" in needs:
        assert kv["cpu_threads"] == 1
    else:  # torch's default: one a core
        import torch
        assert kv["cpu_threads"] == torch.get_num_threads()
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert steps["predicted_s"].notna().all() and (steps["duration_s"] > 0).all()
    # no engine.attention given: on a CPU it is torch's
    assert json.loads((tmp_path / "summary.json").read_text())["kv"]["attention"] == "torch"


def test_a_page_size_that_does_not_divide_the_cpu_pool_runs(tmp_path):
    """Without engine.num_pages the CPU pool is ~32k slots, in whole pages of any size."""
    model_dir = save_tiny_model("llama", tmp_path / "model")
    trace = tmp_path / "p.csv"
    prompt_file(trace, n=3)
    p = run_engine(model_dir, trace, tmp_path / "out", "engine.page_size=3")
    assert p.returncode == 0, p.stderr[-2000:]
    assert (pd.read_parquet(tmp_path / "out" / "requests.parquet")["state"] == "FINISHED").all()
    assert "KV pool of 32766 slots" in (tmp_path / "out" / "run.log").read_text()


def test_engine_bad_inputs(tmp_path):
    model_dir = save_tiny_model("llama", tmp_path / "model")
    trace = tmp_path / "p.csv"
    prompt_file(trace, n=3)
    # a prompt over the model's context is rejected with the reason, the others run
    long = tmp_path / "long.csv"
    pd.DataFrame({"prompt_tokens": [50, 3000], "output_tokens": [4, 4]}).to_csv(long, index=False)
    p = run_engine(model_dir, long, tmp_path / "long")
    assert p.returncode == 0, p.stderr[-2000:]
    req = pd.read_parquet(tmp_path / "long" / "requests.parquet")
    assert list(req["state"]) == ["FINISHED", "REJECTED"] and "context" in req["reject_reason"].iloc[1]
    # a missing tensor: one line naming it and the directory
    import json
    from safetensors.torch import load_file, save_file
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((model_dir / "config.json").read_text())
    tensors = load_file(model_dir / "model.safetensors")
    tensors.pop("model.layers.1.mlp.down_proj.weight")
    save_file(tensors, broken / "model.safetensors")
    p = run_engine(broken, trace, tmp_path / "b1")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "model.layers.1.mlp.down_proj.weight" in p.stderr.splitlines()[-1]
    # a shape that does not match the config
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (broken / "config.json").write_text(json.dumps(cfg))
    save_file(load_file(model_dir / "model.safetensors"), broken / "model.safetensors")
    p = run_engine(broken, trace, tmp_path / "b2")
    assert p.returncode == 2 and "Traceback" not in p.stderr and "shape" in p.stderr.splitlines()[-1]
    # an unsupported architecture
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["architectures"] = ["MixtralForCausalLM"]
    (broken / "config.json").write_text(json.dumps(cfg))
    p = run_engine(broken, trace, tmp_path / "b3")
    assert p.returncode == 2 and "Traceback" not in p.stderr and "MixtralForCausalLM" in p.stderr.splitlines()[-1]
    # a flashinfer option with the torch attention backend
    p = run_engine(model_dir, trace, tmp_path / "b4", "engine.decode_tensor_cores=true")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "engine.decode_tensor_cores is a flashinfer option" in p.stderr.splitlines()[-1]
