"""Tiny random HF models saved as safetensors, and a prompt file, for engine tests."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def tiny_config(kind: str) -> dict:
    base = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=256, max_position_embeddings=2048, bos_token_id=1,
                eos_token_id=2, rms_norm_eps=1e-6, tie_word_embeddings=False)
    if kind == "llama":  # Llama 3.1 style rope scaling, all three frequency bands used
        return {**base, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "rope_theta": 10000.0,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}
    if kind == "llama_1kv":  # fewer KV heads than TP ranks: replicated
        return {**tiny_config("llama"), "num_key_value_heads": 1}
    if kind == "llama_6h":  # divisible by 3 ranks
        return {**tiny_config("llama"), "hidden_size": 96, "intermediate_size": 192, "num_attention_heads": 6,
                "num_key_value_heads": 3}
    if kind == "qwen3":
        return {**base, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 16,
                "rope_theta": 1000000.0, "tie_word_embeddings": True}
    raise ValueError(kind)


def save_tiny_model(kind: str, out: Path) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = dict(tiny_config(kind))
    model_type = cfg.pop("model_type")
    config = AutoConfig.for_model(model_type, **cfg)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).float().eval()
    model.save_pretrained(out)
    return out


def prompt_file(path: Path, n: int = 12, out_tokens: int = 10, seed: int = 0) -> list[list[int]]:
    """Prompts of different lengths, half of them sharing a 40-token prefix."""
    rng = np.random.default_rng(seed)
    shared = rng.integers(3, 256, 40).tolist()
    prompts = []
    for i in range(n):
        p = (shared if i % 2 == 0 else []) + rng.integers(3, 256, int(rng.integers(5, 120))).tolist()
        prompts.append(p)
    pd.DataFrame({"prompt_ids": [json.dumps(p) for p in prompts], "output_tokens": out_tokens,
                  "arrival_s": 0.0}).to_csv(path, index=False)  # all at t=0: plans independent of wall-clock timing
    return prompts


def hf_greedy(model_dir: Path, prompts, n_new: int) -> list[list[int]]:
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir).float().eval()
    outs = []
    for p in prompts:
        ids = torch.tensor([p])
        g = model.generate(ids, max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False)
        outs.append(g[0, ids.shape[1]:].tolist())
    return outs


def run_engine(model_dir: Path, trace: Path, out: Path, *overrides, timeout=600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # engine.attention is left to its default: torch on a CPU
    args = [sys.executable, "-m", "testbed.run", "backend=engine", "engine.device=cpu",
            "engine.dtype=float32", f"model.path={model_dir}", "trace=file", f"trace.path={trace}",
            "progress=false", f"hydra.run.dir={out}", *overrides]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
BYTE_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2 (eos: <|im_end|>)


def save_byte_tokenizer(out: Path) -> int:
    """A byte-level tokenizer (one token per UTF-8 byte, as GPT-2's bytes are spelled, no
    merges: a multi-byte character is several tokens) with ChatML specials and chat template,
    saved as HF files; returns its vocabulary size (259)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    byte_chars = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {s: i for i, s in enumerate(BYTE_SPECIALS)}
    vocab.update({c: len(BYTE_SPECIALS) + i for i, c in enumerate(byte_chars)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(BYTE_SPECIALS))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    fast.save_pretrained(out)
    return len(vocab)


def save_cycling_chat_model(out: Path, text: str, lead_in: str = "\n") -> list[int]:
    """save_tiny_chat_model's model with weights set so that greedy decoding repeats `text`'s
    bytes: after the token of byte i of text comes byte i+1's (cyclically), and after
    `lead_in`'s byte (the chat template's last) text's first. The layers add
    nothing to the residual stream (zero output projections), the embeddings of text's bytes
    are orthogonal, and each one's lm_head row scores the next byte. Returns text's ids (its
    bytes must be distinct)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    save_tiny_chat_model(out)
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok(text)["input_ids"]
    lead = tok(lead_in)["input_ids"]
    assert len(ids) == len(text.encode()) == len(set(ids)), "text's bytes must be distinct, one token each"
    assert len(lead) == 1 and lead[0] not in ids, "lead_in: one byte, not one of text's"
    model = AutoModelForCausalLM.from_pretrained(out).float().eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb, head = model.model.embed_tokens.weight, model.lm_head.weight
        head.zero_()
        for i, tok in enumerate(ids):
            emb[tok] = 0.0
            emb[tok, i] = 1.0
            head[ids[(i + 1) % len(ids)], i] = 10.0
        emb[lead[0]] = 0.0
        emb[lead[0], len(ids)] = 1.0
        head[ids[0], len(ids)] = 10.0
    model.save_pretrained(out)
    return ids


def save_tiny_chat_model(out: Path) -> Path:
    """A tiny random Llama whose vocabulary is the byte tokenizer's, both in one directory."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    out.mkdir(parents=True, exist_ok=True)
    vocab = save_byte_tokenizer(out)
    cfg = {**tiny_config("llama"), "vocab_size": vocab}
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).float().eval().save_pretrained(out)
    return out
