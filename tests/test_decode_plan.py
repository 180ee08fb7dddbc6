"""The split-KV decode plan the cost model emulates (testbed/sim/costmodel/decode_plan.py)."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.sim.costmodel.decode_plan import DecodePlan
from testbed.sim.costmodel.fit import fit_graph, graph_lengths, sample_batch

H200_QWEN = dict(grid=1184, kv_heads=8, sms=132)  # the plan_info the H200 gave Qwen3-0.6B's graphs


def chunks(lens, c):
    return int(((np.asarray(lens) + c - 1) // c).sum())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(1, 20000), min_size=1, max_size=147), min_size=1, max_size=6))
def test_chunk_is_the_least_that_fits_whatever_came_before(batches):
    plan, fresh_each = DecodePlan(**H200_QWEN), None
    for lens in map(np.array, batches):
        c = plan.chunk(lens)  # searched from the previous batch's chunk
        fresh_each = DecodePlan(**H200_QWEN).chunk(lens)
        assert c == fresh_each and c >= plan.min_chunk
        assert chunks(lens, c) <= plan.slots
        assert c == plan.min_chunk or chunks(lens, c - 1) > plan.slots


def test_load_is_the_fullest_sms_tokens_block_by_block():
    plan = DecodePlan(**H200_QWEN)
    for rows, ctx in ((96, 1280), (64, 512), (8, 4096), (3, 100)):
        lens = np.full(rows, ctx)
        c = plan.chunk(lens)
        work = []  # chunk x of the batch, row after row; the last of a row holds the rest
        for L in lens:
            k = -(-L // c)
            work += [c] * (k - 1) + [L - c * (k - 1)]
        sm = np.zeros(plan.sms)
        for head in range(plan.kv_heads):
            for x, w in enumerate(work):
                sm[(x + plan.slots * head) % plan.sms] += w
        assert plan.load(lens) == sm.max()


def test_unequal_rows_load_some_sms_more_than_equal_rows_of_the_same_total():
    # measured: 96 rows of 0.8x-1.2x a context ran 15% longer than 96 of that context
    plan = DecodePlan(**H200_QWEN)
    equal = np.full(96, 1280)
    near = np.random.default_rng(0).permutation(np.round(1280 * np.linspace(0.8, 1.2, 96)).astype(int))
    assert abs(near.sum() - equal.sum()) < 96
    assert plan.load(near) > 1.05 * plan.load(equal)


def test_unsplit_graph_waits_for_its_longest_block_and_for_the_second_wave():
    plan = DecodePlan(**H200_QWEN)
    assert plan.load(np.full(148, 1000)) == 1000  # 1184 blocks: one wave
    assert plan.load(np.full(160, 1000)) == 2000  # 1280 blocks: 96 wait for a first one to finish
    assert plan.load(np.r_[np.full(159, 10), 5000]) >= 5000


def test_tail_is_the_longest_blocks_tokens_beyond_the_free_share_of_the_mean():
    from testbed.sim.costmodel.decode_plan import TAIL_FREE
    plan = DecodePlan(**H200_QWEN)
    assert plan.features(np.full(96, 1280)) == (plan.load(np.full(96, 1280)), 0.0)  # equal blocks: no tail
    # unsplit (160 rows x 8 heads >= the grid): one block a row, the longest row's excess
    lens = np.r_[np.full(159, 1000), 4000]
    assert plan.tail(lens) == 4000 - TAIL_FREE * lens.mean()
    # split: a row of 4x is cut into chunks; the tail is the longest chunk's excess over the mean chunk
    lens = np.r_[np.full(31, 1000), 4000]
    c = plan.chunk(lens)
    work = np.concatenate([[c] * (-(-L // c) - 1) + [L - c * (-(-L // c) - 1)] for L in lens])
    assert plan.tail(lens) == max(0.0, work.max() - TAIL_FREE * work.mean())
    assert plan.features(lens) == (plan.load(lens), plan.tail(lens))


def test_fit_graph_recovers_a_plan_load_model():
    plan = DecodePlan(**H200_QWEN)
    sizes = [16, 32]
    truth = {16: (1.4e-3, 25e-9, 300e-9), 32: (1.5e-3, 24e-9, 350e-9)}
    samples = []
    for s, rows in ((16, 16), (16, 9), (32, 32), (32, 17)):
        for L in (300, 700, 1500, 3000, 6000):
            for pattern, cached in (("uniform", L), ("near", L), ("served", L), ("spread", L)):
                d = {"kind": "decode", "pattern": pattern, "reqs": rows, "extend": 1, "cached": cached - 1}
                e, c = sample_batch(d)
                d["kv_tokens"] = int(np.sum(e) + np.sum(c))
                k0, k1, k2 = truth[s]
                d["device_s"] = k0 + k1 * d["kv_tokens"] + k2 * plan.load(graph_lengths(e, c, s))
                samples.append(d)
    g = fit_graph(samples, sizes, plan.as_dict())
    assert g["plan"] == plan.as_dict()
    for i, s in enumerate(sizes):
        got = (g["const_s"][i], g["per_kv_token_s"][i], g["per_load_token_s"][i])
        assert np.allclose(got, truth[s], rtol=1e-3)
