"""The engine's model side on CPU against HF transformers: tiny random Llama 3.1 (llama3 rope
scaling), Qwen2 (qkv bias, sharded checkpoint) and Qwen3 (q/k norm, tied embeddings)."""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

from testbed.engine.forward_batch import ForwardBatch, paged_kv_layout  # noqa: E402
from testbed.engine.attention import make_attention_backend  # noqa: E402
from testbed.engine.attention.kv_pool import KVPool  # noqa: E402
from testbed.engine.model import (  # noqa: E402
    UnsupportedArchitectureError,
    build_model,
    load_model,
    load_weights,
)
from testbed.engine.model.rotary import rope_inv_freq  # noqa: E402
from testbed.engine.weights import MissingWeightError, WeightShapeError  # noqa: E402

VOCAB = 256
COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=VOCAB,
    max_position_embeddings=512,
    initializer_range=0.1,  # decisive logits: greedy ties are not a coin flip
    eos_token_id=None,
    bos_token_id=None,
    pad_token_id=0,
)


def _llama_config():
    return transformers.LlamaConfig(
        **COMMON,
        num_hidden_layers=3,
        rope_theta=10000.0,
        # original context 64 puts the 8 frequencies of head_dim 16 in all three llama3 bands
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    )


def _qwen2_config():
    return transformers.Qwen2Config(**COMMON, num_hidden_layers=2, rope_theta=10000.0)


def _qwen3_config():
    return transformers.Qwen3Config(
        **COMMON, num_hidden_layers=2, head_dim=32, rope_theta=1000000.0, tie_word_embeddings=True
    )


CONFIGS = {
    "llama": (_llama_config, "LlamaForCausalLM", {}),
    "qwen2": (_qwen2_config, "Qwen2ForCausalLM", {"max_shard_size": "40KB"}),  # sharded + index
    "qwen3": (_qwen3_config, "Qwen3ForCausalLM", {}),
}  # class names, not classes: spawned TP workers re-import this module and stay light


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def hf_dir(request, tmp_path_factory):
    """(HF model in eval mode, dir of its safetensors checkpoint)."""
    make_config, cls_name, save_kwargs = CONFIGS[request.param]
    torch.manual_seed(1234)
    model = getattr(transformers, cls_name)(make_config()).eval()
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path, **save_kwargs)
    return model, path


def _ours(path, backend="torch"):
    model = build_model(path, torch.float32, "cpu", backend)
    load_weights(model, path)
    return model


# --- a trivial stand-in for the scheduler: raw slots, ForwardBatches -------------------------


class Slots:
    """Raw slots handed out page by page (page_size consecutive slots per page), pages in a
    scrambled order so that nothing accidentally relies on contiguity."""

    def __init__(self, num_slots: int, page_size: int = 1) -> None:
        self.page_size = page_size
        pages = list(range(num_slots // page_size))[::-1]
        self.free = pages[::2] + pages[1::2]

    def extend(self, seq: "Seq", n: int) -> list[int]:
        """Slots for seq's next n positions: a fresh page at each page start, else the next slot."""
        out: list[int] = []
        for p in range(seq.cached, seq.cached + n):
            if p % self.page_size == 0:
                out.append(self.free.pop() * self.page_size)
            else:
                out.append((seq.slots + out)[-1] + 1)
        return out


class Seq:
    def __init__(self, tokens, slots=None):
        self.tokens = list(tokens)
        self.slots = list(slots or [])  # slot per cached position
        self.generated: list[int] = []

    @property
    def cached(self) -> int:
        return len(self.slots)


def make_batch(items, alloc: Slots) -> ForwardBatch:
    """items: [(seq, n_new)], the next n_new uncached tokens of each seq."""
    ids, pos, loc, qo, kv, kv_idx = [], [], [], [0], [0], []
    for seq, n in items:
        start = seq.cached
        new_slots = alloc.extend(seq, n)
        ids += seq.tokens[start : start + n]
        pos += list(range(start, start + n))
        loc += new_slots
        seq.slots += new_slots
        kv_idx += seq.slots
        qo.append(qo[-1] + n)
        kv.append(kv[-1] + len(seq.slots))
    fb = ForwardBatch(
        input_ids=torch.tensor(ids, dtype=torch.int64),
        positions=torch.tensor(pos, dtype=torch.int64),
        qo_indptr=torch.tensor(qo, dtype=torch.int32),
        kv_indptr=torch.tensor(kv, dtype=torch.int32),
        kv_indices=torch.tensor(kv_idx, dtype=torch.int32),
        out_cache_loc=torch.tensor(loc, dtype=torch.int32),
        is_decode=all(n == 1 for _, n in items),
        page_size=alloc.page_size,
    )
    fb.validate()
    return fb


def _prompts(seed: int, lengths):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in lengths]


def _hf_last_logits(hf, prompt):
    with torch.no_grad():
        return hf(torch.tensor([prompt])).logits[0, -1].float()


def _hf_greedy(hf, prompt, n):
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, min_new_tokens=n)
    return out[0, len(prompt) :].tolist()


# --- (a) batched prefill logits ------------------------------------------------------------


def test_batched_prefill_logits_match_hf(hf_dir):
    hf, path = hf_dir
    model = _ours(path)
    model.create_kv_pool(512)
    prompts = _prompts(0, [5, 17, 1, 33])
    alloc = Slots(512)
    seqs = [Seq(p) for p in prompts]
    logits = model(make_batch([(s, len(s.tokens)) for s in seqs], alloc))
    assert logits.shape == (len(prompts), VOCAB) and logits.dtype == torch.float32
    for i, p in enumerate(prompts):
        torch.testing.assert_close(logits[i], _hf_last_logits(hf, p), atol=1e-4, rtol=1e-4)


# --- (b) greedy decode: chunked prefill, shared prefix, mixed batches ------------------------


def run_greedy_scenario(model, page_size: int, shared: int, n_new: int = 8):
    """Four requests through chunked prefill, a shared prefix and mixed then pure decode
    batches; returns [(prompt, generated ids)]."""
    model.create_kv_pool(1024, page_size=page_size)
    alloc = Slots(1024, page_size)
    a, c, d = _prompts(1, [12, 21, 7])
    b = a[:shared] + _prompts(2, [6])[0]  # shares a's first `shared` tokens (and their KV)
    sa, sc, sd = Seq(a), Seq(c), Seq(d)

    def greedy(logits, seqs):
        for row, s in zip(logits.argmax(-1).tolist(), seqs):
            s.generated.append(row)
            s.tokens.append(row)

    # step 1: a whole, c's first chunk (its logits are not sampled), d whole
    logits = model(make_batch([(sa, len(a)), (sc, 10), (sd, len(d))], alloc))
    greedy(logits[[0, 2]], [sa, sd])
    # step 2: b joins reusing a's prefix slots, c's second chunk, a and d decode (mixed batch)
    sb = Seq(b, slots=sa.slots[:shared])
    logits = model(make_batch([(sb, len(b) - shared), (sc, len(c) - 10), (sa, 1), (sd, 1)], alloc))
    greedy(logits, [sb, sc, sa, sd])
    # then pure decode batches until everyone has n_new tokens
    live = [sa, sb, sc, sd]
    while live:
        fb = make_batch([(s, 1) for s in live], alloc)
        assert fb.is_decode
        greedy(model(fb), live)
        live = [s for s in live if len(s.generated) < n_new]
    assert sb.slots[:shared] == sa.slots[:shared]
    return [(a, sa.generated), (b, sb.generated), (c, sc.generated), (d, sd.generated)]


def test_greedy_decode_matches_hf_generate(hf_dir):
    hf, path = hf_dir
    for prompt, generated in run_greedy_scenario(_ours(path), page_size=1, shared=9):
        assert generated == _hf_greedy(hf, prompt, len(generated)), prompt


# --- the flashinfer backend's plan/run mapping, against a CPU stand-in for flashinfer -------


class _FakeCompiledModule:
    """The compiled half of a fake wrapper: the attention itself, from positional arguments
    (flashinfer's wrappers end each run() in one such call)."""

    calls = 0

    def paged_run(self, q, k_cache, v_cache, out, p):
        _FakeCompiledModule.calls += 1
        group = p["num_qo_heads"] // p["num_kv_heads"]
        for i in range(len(p["last"])):
            pages = p["indices"][p["indptr"][i] : p["indptr"][i + 1]].long()
            kv_len = (len(pages) - 1) * p["page_size"] + int(p["last"][i])
            k = k_cache[pages].flatten(0, 1)[:kv_len].repeat_interleave(group, 1)
            v = v_cache[pages].flatten(0, 1)[:kv_len].repeat_interleave(group, 1)
            q0, q1 = int(p["qo"][i]), int(p["qo"][i + 1])
            scores = torch.einsum("qhd,khd->hqk", q[q0:q1].float(), k.float()) * p["sm_scale"]
            if p["causal"]:
                n = q1 - q0
                allowed = torch.arange(kv_len)[None, :] <= torch.arange(kv_len - n, kv_len)[:, None]
                scores = scores.masked_fill(~allowed, float("-inf"))
            out[q0:q1] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.float()).to(q.dtype)


class _FakePagedWrapper:
    """flashinfer's paged wrappers as documented (0.6.x argument names, NHD layout), computed
    naively: kv_len = (pages - 1) * page_size + last_page_len, causal mask aligned to the end.
    run() checks its arguments and makes one call into its compiled module, as flashinfer's do."""

    plans = 0
    runs = 0

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_tensor_cores=False, backend="auto"):
        assert kv_layout == "NHD"
        assert backend in ("auto", "fa2", "fa3")  # auto: the non-tensor-core decode kernel (no template choice)
        self._plan = None
        self._cached_module = _FakeCompiledModule()

    def _check(self, indptr, indices, last_page_len, page_size):
        assert indptr.dtype == indices.dtype == last_page_len.dtype == torch.int32
        assert ((last_page_len >= 1) & (last_page_len <= page_size)).all()
        assert int(indptr[-1]) == indices.numel()
        _FakePagedWrapper.plans += 1

    def run(self, q, paged_kv_cache, *, out=None):
        _FakePagedWrapper.runs += 1
        k_cache, v_cache = paged_kv_cache  # [pages, page_size, kv_heads, D]
        assert out is None or (out.shape == q.shape and out.dtype == q.dtype)
        out = torch.zeros_like(q) if out is None else out
        self._cached_module.paged_run(q, k_cache, v_cache, out, self._plan)
        return out


class _FakeDecodeWrapper(_FakePagedWrapper):
    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
             page_size, *, pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None,
             q_data_type="float16", kv_data_type=None, sm_scale=None, non_blocking=True):
        self._check(indptr, indices, last_page_len, page_size)
        qo = torch.arange(len(last_page_len) + 1, dtype=torch.int32)
        self._plan = dict(indptr=indptr, indices=indices, last=last_page_len, qo=qo, causal=False,
                          num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                          page_size=page_size, sm_scale=sm_scale)


class _FakePrefillWrapper(_FakePagedWrapper):
    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
             num_qo_heads, num_kv_heads, head_dim_qk, page_size, head_dim_vo=None,
             custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None,
             rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
             non_blocking=True):
        self._check(paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, page_size)
        assert qo_indptr.dtype == torch.int32
        self._plan = dict(indptr=paged_kv_indptr, indices=paged_kv_indices,
                          last=paged_kv_last_page_len, qo=qo_indptr, causal=causal,
                          num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                          page_size=page_size, sm_scale=sm_scale)


@pytest.fixture
def fake_flashinfer(monkeypatch):
    import sys
    import types

    from testbed.engine.attention.flashinfer_backend import FlashInferAttentionBackend

    mod = types.ModuleType("flashinfer")
    mod.BatchDecodeWithPagedKVCacheWrapper = _FakeDecodeWrapper
    mod.BatchPrefillWithPagedKVCacheWrapper = _FakePrefillWrapper
    monkeypatch.setitem(sys.modules, "flashinfer", mod)
    monkeypatch.setattr(FlashInferAttentionBackend, "_require_cuda", False)
    _FakePagedWrapper.plans = _FakePagedWrapper.runs = _FakeCompiledModule.calls = 0
    return mod


@pytest.mark.parametrize("page_size", [1, 4])
def test_flashinfer_mapping_matches_hf_generate(hf_dir, fake_flashinfer, page_size):
    hf, path = hf_dir
    model = _ours(path, backend="flashinfer")
    calls = {"n": 0}
    real_forward = model.forward
    model.forward = lambda fb: (calls.__setitem__("n", calls["n"] + 1), real_forward(fb))[1]
    # a page-aligned shared prefix (8 = 2 pages of 4), as a radix cache would share
    for prompt, generated in run_greedy_scenario(model, page_size=page_size, shared=8):
        assert generated == _hf_greedy(hf, prompt, len(generated)), prompt
    assert _FakePagedWrapper.plans == calls["n"]  # one plan per step, not per layer
    # one run() per step (the first layer's), its compiled call replayed on the other layers
    assert _FakePagedWrapper.runs == calls["n"]
    assert _FakeCompiledModule.calls == calls["n"] * model.config.num_layers


# --- (c) weight errors ---------------------------------------------------------------------


def _copy_single_file(hf_dir, tmp_path) -> tuple[Path, Path]:
    _, path = hf_dir
    dst = tmp_path / "ckpt"
    shutil.copytree(path, dst)
    files = sorted(dst.glob("*.safetensors"))
    return dst, files[0]


def test_missing_tensor_is_named(hf_dir, tmp_path):
    dst, _ = _copy_single_file(hf_dir, tmp_path)
    for f in sorted(dst.glob("*.safetensors")):
        tensors = load_file(f)
        found = [n for n in sorted(tensors) if n.endswith("mlp.up_proj.weight")]
        if found:
            victim = found[0]
            del tensors[victim]
            save_file(tensors, f)
            break
    index = dst / "model.safetensors.index.json"
    if index.exists():  # keep the index honest
        data = json.loads(index.read_text())
        data["weight_map"].pop(victim)
        index.write_text(json.dumps(data))
    model = build_model(dst, torch.float32, "cpu", "torch")
    with pytest.raises(MissingWeightError) as e:
        load_weights(model, dst)
    assert victim in str(e.value) and str(dst) in str(e.value)


def test_wrong_shape_is_named(hf_dir, tmp_path):
    dst, f = _copy_single_file(hf_dir, tmp_path)
    tensors = load_file(f)
    victim = sorted(tensors)[0]
    good = tuple(tensors[victim].shape)
    tensors[victim] = torch.zeros(good[0] + 1, *good[1:])
    save_file(tensors, f)
    model = build_model(dst, torch.float32, "cpu", "torch")
    with pytest.raises(WeightShapeError) as e:
        load_weights(model, dst)
    msg = str(e.value)
    assert victim in msg and str(good) in msg and str((good[0] + 1, *good[1:])) in msg


@pytest.mark.parametrize("keep", [0.5, 0.0])  # cut short; empty
def test_truncated_checkpoint_is_one_error_naming_the_file(hf_dir, tmp_path, keep):
    from testbed.engine.weights import WeightLoadError
    dst, f = _copy_single_file(hf_dir, tmp_path)
    data = f.read_bytes()
    f.write_bytes(data[: int(len(data) * keep)])
    model = build_model(dst, torch.float32, "cpu", "torch")
    with pytest.raises(WeightLoadError) as e:
        load_weights(model, dst)
    msg = str(e.value)
    assert str(f) in msg and "safetensors" in msg and "\n" not in msg


def test_unexpected_tensor_is_a_warning(hf_dir, tmp_path):
    dst, f = _copy_single_file(hf_dir, tmp_path)
    tensors = load_file(f)
    tensors["model.layers.0.mystery.weight"] = torch.zeros(3)
    save_file(tensors, f)
    model = build_model(dst, torch.float32, "cpu", "torch")
    with pytest.warns(UserWarning, match="mystery"):
        report = load_weights(model, dst)
    assert report.unexpected == ["model.layers.0.mystery.weight"]


def test_unsupported_architecture(hf_dir, tmp_path):
    dst, _ = _copy_single_file(hf_dir, tmp_path)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitectureError) as e:
        build_model(dst, torch.float32, "cpu", "torch")
    assert "GPT2LMHeadModel" in str(e.value) and "LlamaForCausalLM" in str(e.value)
    # a model built for another architecture refuses the dir too
    model = build_model(_qwen2_config(), torch.float32, "cpu", "torch")
    with pytest.raises(UnsupportedArchitectureError, match="GPT2LMHeadModel"):
        load_weights(model, dst)


def test_unknown_attention_backend_lists_known():
    with pytest.raises(ValueError, match="flashinfer.*torch|torch.*flashinfer"):
        make_attention_backend("nope", num_qo_heads=4, num_kv_heads=2, head_dim=16,
                               dtype=torch.float32, device="cpu")


# --- smaller pieces ---------------------------------------------------------------------------


def test_load_model_and_dummy_weights_bf16():
    cfg = _llama_config()
    model = build_model(cfg, torch.bfloat16, "cpu", "torch")
    load_weights(model, "dummy", seed=3)
    first = model.layers[0].self_attn.qkv_proj.weight.clone()
    load_weights(model, "dummy", seed=3)
    assert torch.equal(first, model.layers[0].self_attn.qkv_proj.weight)  # seeded
    assert 0.01 < first.float().std().item() < 0.03
    model.create_kv_pool(64)
    logits = model(make_batch([(Seq(_prompts(5, [9])[0]), 9)], Slots(64)))
    assert torch.isfinite(logits).all()


def test_load_model_convenience(hf_dir):
    hf, path = hf_dir
    model = load_model(path, dtype=torch.float32)
    model.create_kv_pool(64)
    p = _prompts(7, [6])[0]
    logits = model(make_batch([(Seq(p), 6)], Slots(64)))
    torch.testing.assert_close(logits[0], _hf_last_logits(hf, p), atol=1e-4, rtol=1e-4)


def test_llama3_inv_freq_bands():
    base = rope_inv_freq(16, 10000.0)
    s = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
         "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    scaled = rope_inv_freq(16, 10000.0, s)
    wavelen = 2 * torch.pi / base
    assert torch.equal(scaled[wavelen < 16], base[wavelen < 16])  # high frequencies kept
    torch.testing.assert_close(scaled[wavelen > 64], base[wavelen > 64] / 8)  # low ones divided
    mid = (wavelen >= 16) & (wavelen <= 64)
    assert mid.any()
    assert ((scaled[mid] < base[mid]) & (scaled[mid] > base[mid] / 8)).all()


def test_paged_kv_layout_page_ids_and_last_lengths():
    ps = 4
    # request 0: 6 tokens in pages 3, 7; request 1: 4 tokens in page 1; request 2: 9 tokens in 5, 0, 2
    slots = [
        [12, 13, 14, 15, 28, 29],
        [4, 5, 6, 7],
        [20, 21, 22, 23, 0, 1, 2, 3, 8],
    ]
    kv_indptr = torch.tensor([0, 6, 10, 19], dtype=torch.int32)
    kv_indices = torch.tensor(sum(slots, []), dtype=torch.int32)
    indptr, ids, last = paged_kv_layout(kv_indptr, kv_indices, ps)
    assert indptr.tolist() == [0, 2, 3, 6]
    assert ids.tolist() == [3, 7, 1, 5, 0, 2]
    assert last.tolist() == [2, 4, 1]
    assert indptr.dtype == ids.dtype == last.dtype == torch.int32
    indptr1, ids1, last1 = paged_kv_layout(kv_indptr, kv_indices, 1)
    assert torch.equal(ids1, kv_indices) and last1.tolist() == [1, 1, 1]


def test_kv_pool_paged_view_shares_memory():
    pool = KVPool(2, 32, 2, 8, torch.float32, "cpu", page_size=4)
    k = torch.randn(3, 2, 8)
    pool.write(1, torch.tensor([5, 6, 30]), k, -k)
    kp, vp = pool.paged(1)
    assert kp.shape == (8, 4, 2, 8)
    assert torch.equal(kp[1, 1], k[0]) and torch.equal(vp[7, 2], -k[2])
    assert pool.nbytes == 2 * 2 * 32 * 2 * 8 * 4
    with pytest.raises(ValueError):
        KVPool(1, 30, 2, 8, torch.float32, "cpu", page_size=4)


def test_forward_batch_validate_catches_bad_tail():
    fb = ForwardBatch(
        input_ids=torch.tensor([1, 2]),
        positions=torch.tensor([3, 4]),
        qo_indptr=torch.tensor([0, 2], dtype=torch.int32),
        kv_indptr=torch.tensor([0, 5], dtype=torch.int32),
        kv_indices=torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32),
        out_cache_loc=torch.tensor([3, 9], dtype=torch.int32),
        is_decode=False,
    )
    with pytest.raises(ValueError, match="tail"):
        fb.validate()


# --- tensor parallelism on CPU (gloo, 2 processes) ------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tp_worker(rank, world, port, path, prompts, out_dir):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = build_model(path, torch.float32, "cpu", "torch", tp_rank=rank, tp_size=world)
        load_weights(model, path)
        model.create_kv_pool(256)
        logits = model(make_batch([(Seq(p), len(p)) for p in prompts], Slots(256)))
        torch.save(logits, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_tensor_parallel_gloo_matches_hf(tmp_path):
    """tp=2 over gloo, Llama with 4 q heads and 1 kv head: q heads and the MLP are split,
    the kv head is replicated, vocab rows are split (embedding all-reduce, lm head all-gather)."""
    import torch.multiprocessing as mp

    world = 2
    torch.manual_seed(99)
    cfg = _llama_config()
    cfg.num_key_value_heads = 1
    hf = transformers.LlamaForCausalLM(cfg).eval()
    path = tmp_path / "llama"
    hf.save_pretrained(path)
    prompts = _prompts(11, [7, 3])
    mp.spawn(_tp_worker, args=(world, _free_port(), str(path), prompts, str(tmp_path)),
             nprocs=world, join=True)  # not fork: forked OpenMP/gloo children can hang
    for rank in range(world):
        logits = torch.load(tmp_path / f"rank{rank}.pt")
        for i, p in enumerate(prompts):
            torch.testing.assert_close(logits[i], _hf_last_logits(hf, p), atol=1e-4, rtol=1e-4)


def test_forward_batch_to_keeps_host_indptrs():
    fb = make_batch([(Seq([1, 2, 3]), 3)], Slots(16))
    moved = fb.to("cpu")
    assert moved.kv_indptr_cpu is not None and moved.host_qo_indptr().tolist() == [0, 3]
    assert fb.kv_indptr_cpu is None and fb.host_kv_indptr().tolist() == [0, 3]
