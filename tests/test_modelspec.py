"""ModelSpec: parsing HF config.json, exact parameter counts, path resolution, Hydra group."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from testbed.modelspec import (
    CONF_MODEL_DIR,
    SUPPORTED_ARCHITECTURES,
    ModelConfig,
    ModelSpec,
    load_model_spec,
    model_spec_from_cfg,
    resolve_config_path,
)

MODELS = ["llama3_8b", "llama3_70b", "qwen3_0_6b", "qwen3_8b", "qwen3_32b", "smollm2_135m"]

# Exact counts (sum of numel over the HF model's parameters, derived by hand from the
# shapes) and the size the model card publishes.
EXACT_PARAMS = {
    "llama3_8b": 8_030_261_248,
    "llama3_70b": 70_553_706_496,
    "qwen3_0_6b": 596_049_920,
    "qwen3_8b": 8_190_735_360,
    "qwen3_32b": 32_762_123_264,
    "smollm2_135m": 134_515_008,
}
PUBLISHED = {
    "llama3_8b": 8.03e9,
    "llama3_70b": 70.6e9,
    "qwen3_0_6b": 0.596e9,
    "qwen3_8b": 8.19e9,
    "qwen3_32b": 32.8e9,
    "smollm2_135m": 134.5e6,
}


def spec(name: str) -> ModelSpec:
    return load_model_spec(f"hf/{name}.json", name=name)


@pytest.mark.parametrize("name", MODELS)
def test_param_count_matches_published_size(name):
    s = spec(name)
    assert s.param_count() == EXACT_PARAMS[name]
    assert s.param_count() == pytest.approx(PUBLISHED[name], rel=0.005)
    assert s.weight_bytes() == 2 * s.param_count()


def test_qwen3_0_6b_non_embedding():
    s = spec("qwen3_0_6b")
    assert s.tie_word_embeddings
    assert s.non_embedding_param_count() == pytest.approx(0.44e9, rel=0.01)


def test_llama3_8b_fields():
    s = spec("llama3_8b")
    assert s.architecture == "LlamaForCausalLM"
    assert (s.hidden_size, s.intermediate_size, s.num_layers) == (4096, 14336, 32)
    assert (s.num_q_heads, s.num_kv_heads, s.head_dim) == (32, 8, 128)
    assert (s.vocab_size, s.max_context) == (128256, 131072)
    assert s.rope_theta == 500000.0
    assert s.rope_scaling == {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    }
    assert s.eos_token_ids == (128001, 128008, 128009)
    assert s.rms_norm_eps == 1e-5
    assert not s.tie_word_embeddings and not s.qk_norm and not s.attention_bias
    assert s.dtype_bytes == 2
    assert s.kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2 == 131072
    assert s.name == "llama3_8b" and s.source.endswith("llama3_8b.json")


def test_qwen3_fields():
    s = spec("qwen3_8b")
    assert s.qk_norm and not s.attention_bias and not s.tie_word_embeddings
    assert s.head_dim == 128 and s.max_context == 40960 and s.rope_scaling is None
    assert s.eos_token_ids == (151645,)
    s32 = spec("qwen3_32b")
    assert s32.head_dim * s32.num_q_heads == 8192 != s32.hidden_size  # explicit head_dim


def test_smollm2_fields():
    s = spec("smollm2_135m")
    assert s.head_dim == 64  # derived: 576 / 9
    assert (s.num_q_heads, s.num_kv_heads) == (9, 3)
    assert s.eos_token_ids == (2,) and s.bos_token_id == 1
    assert s.tie_word_embeddings and s.rope_theta == 100000.0


def qwen25_7b_config() -> dict:
    # Qwen2.5-7B (config.json on the HF Hub): published size 7.61B.
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "eos_token_id": 151643,
        "torch_dtype": "bfloat16",
    }


def test_qwen2_has_qkv_bias():
    s = ModelSpec.from_hf_config(qwen25_7b_config())
    assert s.attention_bias and not s.qk_norm
    assert s.param_count() == 7_615_616_512
    assert s.param_count() == pytest.approx(7.61e9, rel=0.002)


def test_unknown_architecture():
    cfg = qwen25_7b_config() | {"architectures": ["MixtralForCausalLM"]}
    with pytest.raises(ValueError) as e:
        ModelSpec.from_hf_config(cfg, source="mixtral.json")
    msg = str(e.value)
    assert "MixtralForCausalLM" in msg
    for arch in SUPPORTED_ARCHITECTURES:
        assert arch in msg


@pytest.mark.parametrize(
    "field",
    ["architectures", "hidden_size", "intermediate_size", "num_hidden_layers",
     "num_attention_heads", "vocab_size", "max_position_embeddings"],
)
def test_missing_field_names_field_and_file(tmp_path, field):
    cfg = qwen25_7b_config()
    del cfg[field]
    p = tmp_path / "broken.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(ValueError) as e:
        load_model_spec(p)
    assert field in str(e.value) and str(p) in str(e.value)


def test_defaults_and_variants():
    cfg = qwen25_7b_config()
    for k in ("num_key_value_heads", "eos_token_id", "torch_dtype", "rope_theta", "rms_norm_eps"):
        del cfg[k]
    s = ModelSpec.from_hf_config(cfg)
    assert s.num_kv_heads == s.num_q_heads  # HF default: MHA
    assert s.eos_token_ids == () and s.dtype_bytes == 2
    assert s.rope_theta == 10000.0
    assert ModelSpec.from_hf_config(cfg | {"dtype": "float32"}).dtype_bytes == 4
    assert ModelSpec.from_hf_config(cfg | {"torch_dtype": "float16"}).dtype_bytes == 2
    with pytest.raises(ValueError, match="torch_dtype"):
        ModelSpec.from_hf_config(cfg | {"torch_dtype": "int3"})
    with pytest.raises(ValueError, match="eos_token_id"):
        ModelSpec.from_hf_config(cfg | {"eos_token_id": "x"})
    with pytest.raises(ValueError, match="hidden_size"):
        ModelSpec.from_hf_config(cfg | {"hidden_size": -1})


def test_spec_is_frozen():
    s = spec("smollm2_135m")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.hidden_size = 1  # type: ignore[misc]


def test_path_resolution(tmp_path, monkeypatch):
    conf_rel = resolve_config_path("hf/qwen3_8b.json")
    assert conf_rel == CONF_MODEL_DIR / "hf" / "qwen3_8b.json"
    # absolute path, a model dir, and a cwd-relative path
    model_dir = tmp_path / "MyModel"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(qwen25_7b_config()))
    assert load_model_spec(model_dir / "config.json").attention_bias
    assert load_model_spec(model_dir).attention_bias
    monkeypatch.chdir(tmp_path)
    assert load_model_spec("MyModel/config.json").hidden_size == 3584
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_model_spec("nope.json")


@pytest.mark.parametrize("name", MODELS)
def test_hydra_group_files(name):
    node = OmegaConf.load(CONF_MODEL_DIR / f"{name}.yaml")
    assert node.name == name and node.path is None and node.weights == "real"
    s = model_spec_from_cfg(node)
    assert s.param_count() == EXACT_PARAMS[name] and s.name == name


def test_hydra_compose_and_override(tmp_path):
    from hydra import compose, initialize_config_dir

    p = tmp_path / "c.json"
    p.write_text(json.dumps(qwen25_7b_config()))
    with initialize_config_dir(config_dir=str(CONF_MODEL_DIR.parent), version_base="1.3"):
        cfg = compose(overrides=["+model=llama3_8b"])
        assert model_spec_from_cfg(cfg.model).param_count() == EXACT_PARAMS["llama3_8b"]
        cfg = compose(overrides=["+model=llama3_8b", f"model.config_path={p}"])
        assert model_spec_from_cfg(cfg.model).architecture == "Qwen2ForCausalLM"


def test_model_config_validation():
    with pytest.raises(ValueError, match=r"model.weights='fake'.*real.*dummy"):
        ModelConfig(name="x", config_path="hf/llama3_8b.json", weights="fake")
    with pytest.raises(ValueError, match="unknown key"):
        model_spec_from_cfg({"name": "x", "config_path": "hf/llama3_8b.json", "bogus": 1})
    with pytest.raises(ValueError, match="config_path"):
        model_spec_from_cfg({"name": "x"})
    mc = ModelConfig(name="q", config_path="hf/qwen3_0_6b.json", weights="dummy")
    assert model_spec_from_cfg(mc).name == "q"


def test_every_shipped_config_is_listed_in_sources():
    hf = CONF_MODEL_DIR / "hf"
    sources = (hf / "SOURCES.md").read_text()
    shipped = sorted(p.stem for p in hf.glob("*.json"))
    assert shipped == sorted(MODELS)
    for name in shipped:
        assert f"{name}.json" in sources
        assert (CONF_MODEL_DIR / f"{name}.yaml").is_file()


def test_rope_theta_from_transformers5_rope_parameters():
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
           "max_position_embeddings": 2048, "rope_parameters": {"rope_type": "default", "rope_theta": 123456.0}}
    assert ModelSpec.from_hf_config(cfg).rope_theta == 123456.0


def test_kv_bytes_per_rank():
    s = spec("llama3_8b")  # 8 KV heads
    assert [s.kv_heads_per_rank(tp) for tp in (1, 2, 8, 16)] == [8, 4, 1, 1]  # 16 ranks: replicated
    assert s.kv_bytes_per_token(2) == s.kv_bytes_per_token() // 2
    assert s.kv_bytes_per_token(1, dtype_bytes=4) == 2 * s.kv_bytes_per_token()


def test_transformers_config_dict():
    # what a transformers 5 config built in code gives: no architectures, scaling in rope_parameters
    cfg = qwen25_7b_config() | {"architectures": None, "model_type": "llama", "rope_theta": None, "dtype": None,
                                "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 5e5}}
    s = ModelSpec.from_hf_config(cfg)
    assert s.architecture == "LlamaForCausalLM" and s.rope_theta == 5e5 and s.dtype == "bfloat16"
    assert s.rope_scaling == {"factor": 8.0, "rope_type": "llama3"}
    with pytest.raises(ValueError, match="architectures"):
        ModelSpec.from_hf_config(cfg | {"model_type": "gpt2"})


def test_biases_follow_hf():
    llama = qwen25_7b_config() | {"architectures": ["LlamaForCausalLM"], "attention_bias": True}
    s = ModelSpec.from_hf_config(llama)  # Llama puts attention_bias on q, k, v and o
    assert s.attention_bias and s.o_bias
    assert s.param_count() == 7_615_616_512 + 28 * 3584
    q2 = ModelSpec.from_hf_config(qwen25_7b_config())  # Qwen2: q, k, v only, whatever the config says
    assert q2.attention_bias and not q2.o_bias


def test_unsupported_model_features_are_one_line():
    from testbed.modelspec import UnsupportedArchitectureError
    with pytest.raises(UnsupportedArchitectureError, match="hidden_act='gelu'.*allowed: silu"):
        ModelSpec.from_hf_config(qwen25_7b_config() | {"hidden_act": "gelu"}, source="g.json")
    with pytest.raises(UnsupportedArchitectureError, match="use_sliding_window"):
        ModelSpec.from_hf_config(qwen25_7b_config() | {"use_sliding_window": True})
