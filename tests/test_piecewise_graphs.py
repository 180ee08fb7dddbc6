"""Piecewise graphs (testbed/engine/piecewise_graphs.py) without CUDA: the same pieces run
eagerly (capture=False) against the model's plain forward, padding rows included. The graph
capture itself runs on the GPU (benchmarks/check_piecewise.py)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402
from hypothesis import given, settings, strategies as st  # noqa: E402

from testbed.engine.model import build_model, load_weights  # noqa: E402
from testbed.modelspec import load_model_spec  # noqa: E402
from testbed.engine.piecewise_graphs import PiecewiseGraphs, token_sizes  # noqa: E402
from testbed.engine.synthetic_batch import synthetic_host_batch  # noqa: E402
from tests.engine_fixtures import tiny_config  # noqa: E402

SLOTS = 512


@given(st.integers(1, 20000))
@settings(max_examples=300, deadline=None)
def test_token_sizes_cover_with_bounded_padding(max_tokens):
    sizes = token_sizes(max_tokens)
    assert sizes == sorted(set(sizes)) and all(s % 16 == 0 for s in sizes)
    assert sizes[-1] >= max_tokens > (sizes[-2] if len(sizes) > 1 else 0)
    for t in {1, 15, 16, 17, 255, 256, 257, 1000, max_tokens // 2 + 1, max_tokens}:
        if t <= max_tokens:
            s = next(s for s in sizes if s >= t)
            assert s - t < 16 or s - t <= t / 8, (t, s)  # at most 12.5% padding above 16 tokens


def _model(kind, tmp_path):
    import json
    (tmp_path / "config.json").write_text(json.dumps(tiny_config(kind)))
    model = build_model(load_model_spec(tmp_path), torch.float32, "cpu", "torch", kernels="torch")
    load_weights(model, "dummy", seed=0)
    model.create_kv_pool(SLOTS + 1, 1)  # + the scratch slot
    return model


def _pool_state(model):
    pool = model.attn_backend.pool
    return [t.clone() for t in pool.k] + [t.clone() for t in pool.v]


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_pieces_equal_the_forward(kind, tmp_path):
    model = _model(kind, tmp_path)
    pieces = PiecewiseGraphs(model, "cpu", 300, scratch_slot=SLOTS, capture=False)
    pool = model.attn_backend.pool
    torch.manual_seed(1)
    for t in list(pool.k) + list(pool.v):
        t.normal_()
    # a prefill chunk over a cached prefix beside decodes (42 tokens: 6 padding rows), then a
    # bigger step and a smaller one again: stale rows in the fixed buffers must not matter
    for ext, cac in [([37] + [1] * 5, [0] + [20] * 5), ([150, 90], [10, 0]), ([3, 1], [7, 30])]:
        fb = synthetic_host_batch(ext, cac, SLOTS, 1, model.config.vocab_size, seed=len(ext)).fb
        before = _pool_state(model)
        got = pieces.run(fb)
        after_pieces = _pool_state(model)
        for t, b in zip(list(pool.k) + list(pool.v), before):
            t.copy_(b)
        want = model(fb)
        after_forward = _pool_state(model)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        T, s = fb.num_tokens, pieces.size_for(fb.num_tokens)
        for a, b, old in zip(after_pieces, after_forward, before):
            torch.testing.assert_close(a[:SLOTS], b[:SLOTS], rtol=1e-5, atol=1e-5)  # the same K/V written
            assert torch.equal(a[SLOTS], old[SLOTS]) == (s == T)  # padding rows wrote the scratch slot only


def test_fits_up_to_the_largest_size(tmp_path):
    model = _model("qwen3", tmp_path)
    pieces = PiecewiseGraphs(model, "cpu", 40, scratch_slot=SLOTS, capture=False)
    assert pieces.sizes == [16, 32, 48] and pieces.num_graphs == 3 * (model.config.num_layers + 1)
    small = synthetic_host_batch([48], [0], SLOTS, 1, 256).fb
    big = synthetic_host_batch([49], [0], SLOTS, 1, 256).fb
    assert pieces.fits(small) and not pieces.fits(big)


def test_whole_step_graphs_take_the_steps_whose_query_tile_they_plan_alike():
    """engine.whole_step_graphs replays an eager step of up to its largest size and fewer
    requests than its slots when the graph's plan (tile from the most rows one request could
    hold) and the eager plan (from the mean) pick the same query tile; the graphs themselves are
    captured on the GPU (benchmarks/exp_full_graph_eager.py)."""

    from testbed.engine.whole_graphs import WholeStepGraphs
    from testbed.sim.costmodel.fit import WholeStepRule, fa2_query_tile
    assert [fa2_query_tile(x) for x in (1, 16, 17, 64, 65)] == [16, 16, 64, 64, 128]
    whole = object.__new__(WholeStepGraphs)  # key() reads only these; building captures on CUDA
    whole.rule = WholeStepRule(tuple(token_sizes(64)), (2, 4), 2)
    whole.max_tokens, whole.slots, whole.max_kv = 64, (2, 4), 3 * 100 + 64 + 4

    def fits(ext, cac):
        return whole.key(synthetic_host_batch(ext, cac, SLOTS, 1, 256).fb) is not None
    assert whole.key(synthetic_host_batch([40], [0], SLOTS, 1, 256).fb) == (48, 2)  # padded tokens, slots
    assert whole.key(synthetic_host_batch([10] * 3, [0, 20, 40], SLOTS, 1, 256).fb) == (32, 4)
    assert fits([40], [0]) and fits([64], [0]) and not fits([65], [0])  # its largest size
    assert fits([30, 1], [0, 50]) and fits([10, 10, 10], [0, 20, 40])  # tile 64 both ways
    assert not fits([2], [30])  # eager tile 16 (4 packed rows), the graph's 64 (15 rows could be one's)
    assert not fits([4, 1, 1], [0, 30, 60])  # a short chunk beside decodes: 16 against 64
    assert not fits([1, 1], [10, 20])  # a decode step: the decode graphs'
    assert not fits([10, 10, 10, 10], [0] * 4)  # more requests than the slots hold beside the padding
    assert not fits([50], [310]) and fits([50], [150])  # its page-id buffer


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 1100), st.integers(1, 20)), min_size=1, max_size=40),
       st.sampled_from([1, 2, 4, 8]))
def test_whole_step_rule_on_arrays_takes_the_steps_it_takes_one_by_one(steps, group):
    """The simulator classifies a replay's steps at once (WholeStepRule.taken), the engine one
    at a time (graph): the same steps."""
    from testbed.sim.costmodel.fit import WholeStepRule
    rule = WholeStepRule(tuple(s for s in token_sizes(8192) if s <= 1024), (2, 4, 8, 16), group)
    t, b = np.array(steps).T
    assert rule.taken(t, b).tolist() == [rule.graph(int(x), int(y)) is not None for x, y in steps]


def test_a_pending_synthetic_batch_reads_its_decode_ids_from_the_last_tokens(tmp_path):
    """The profiler's grid steps gather their decode rows' ids on the device as served steps
    do: the same step with those ids written in computes the same tokens."""
    from testbed.engine.executor import EngineExecutor
    from testbed.engine.synthetic_batch import greedy_sampling
    model = _model("qwen3", tmp_path)
    ex = EngineExecutor(model, torch.device("cpu"), 8)
    ext, cac = [5, 1, 1], [0, 12, 30]
    pend = synthetic_host_batch(ext, cac, SLOTS, 1, model.config.vocab_size, seed=2, pending=True)
    assert pend.pending_at.tolist() == [5, 6] and pend.pending_rows.tolist() == [1, 2]
    plain = synthetic_host_batch(ext, cac, SLOTS, 1, model.config.vocab_size, seed=2)
    assert len(plain.pending_at) == 0
    last = torch.tensor([3, 17, 29, 0, 0, 0, 0, 0])
    written = plain.fb.input_ids.clone()
    written[[5, 6]] = last[[1, 2]]
    assert not torch.equal(written, plain.fb.input_ids)  # the gather changes what runs
    plain.fb.input_ids = written
    runs = []
    for hb in (pend, plain):
        ex.last_token.copy_(last)
        runs.append(ex.collect(ex.launch_host(hb, greedy_sampling(3))).tokens.tolist())
    assert runs[0] == runs[1]


def test_a_step_with_more_rows_than_the_page_table_is_refused_by_name(tmp_path):
    """On CUDA a row past the executor's buffers is a device-side assert that kills the process
    (exp_sustained_decode.py's 256 decode rows beside a prompt, 2026-12-07): a clear error instead."""
    from testbed.engine.executor import EngineExecutor
    from testbed.engine.synthetic_batch import greedy_sampling
    model = _model("qwen3", tmp_path)
    ex = EngineExecutor(model, torch.device("cpu"), 2)
    hb = synthetic_host_batch([4, 1, 1], [0, 6, 9], SLOTS, 1, model.config.vocab_size, pending=True)
    with pytest.raises(ValueError, match="3 rows exceeds the engine's 2 page-table rows"):
        ex.launch_host(hb, greedy_sampling(3))
    fits = synthetic_host_batch([4, 1], [0, 6], SLOTS, 1, model.config.vocab_size, pending=True)
    assert len(ex.collect(ex.launch_host(fits, greedy_sampling(2))).tokens) == 2
