"""Tests of testbed.traces: every bundled trace, determinism, arrivals, prefix sharing,
the over-context rule, the user-file loader, and the errors on bad input."""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.traces import TRACE_DIR, TRACES, Trace, TraceConfig, TraceError, load_trace

BUNDLED = [n for n in TRACES.names() if n not in ("synthetic", "file")]

# README statistics (tokens, over every row): rows, prompt mean, output mean, prompt max
README = {
    "sharegpt": (30731, 2340, 439, 8141),
    "azure_conv": (19366, 1155, 211, 14050),
    "azure_code": (8819, 2048, 28, 7437),
    "arxiv": (28257, 2588, 291, 4054),
    "bwb": (33768, 1067, 1613, 3504),
    "mooncake_conversation": (12031, 12035, 343, 126195),
    "mooncake_synthetic": (3993, 15325, 149, 191378),
}


def load(**kw) -> Trace:
    return load_trace(kw)


def lens(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([r.prompt_len for r in trace.requests]),
            np.array([r.output_len for r in trace.requests]))


def arrivals(trace: Trace) -> np.ndarray:
    return np.array([r.arrival_s for r in trace.requests])


def check_well_formed(trace: Trace, vocab: int = 32000) -> None:
    assert [r.rid for r in trace.requests] == list(range(len(trace.requests)))
    t = arrivals(trace)
    assert np.all(np.diff(t) >= 0) and (len(t) == 0 or t[0] >= 0)
    for r in trace.requests:
        assert r.prompt_ids.dtype == np.int32 and r.prompt_ids.ndim == 1
        assert len(r.prompt_ids) >= 1 and r.output_len >= 1
        assert 0 <= r.prompt_ids.min() and r.prompt_ids.max() < vocab
        assert isinstance(r.rid, int) and isinstance(r.output_len, int) and isinstance(r.priority, int)
    assert trace.over_context["rule"] in ("reject", "truncate")
    assert trace.over_context["count"] == len(trace.over_context["rids"])


# ---------------------------------------------------------------- bundled traces

@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_trace_loads_200_with_sane_statistics(name):
    trace = load(name=name, num_requests=200)
    assert trace.name == name and len(trace) == 200
    check_well_formed(trace)
    p, o = lens(trace)
    rows, p_mean, o_mean, p_max = README[name]
    assert 0.4 * p_mean < p.mean() < 1.6 * p_mean
    assert 0.3 * o_mean < o.mean() < 2.0 * o_mean
    assert p.max() <= p_max
    assert any(n.startswith("source: ") and f"({rows} rows)" in n for n in trace.notes)


@pytest.mark.parametrize("name", ["sharegpt", "arxiv", "bwb", "azure_conv", "azure_code"])
def test_whole_file_matches_readme(name):
    trace = load(name=name, num_requests=None)
    rows, p_mean, o_mean, p_max = README[name]
    assert len(trace) == rows
    p, o = lens(trace)
    assert abs(p.mean() - p_mean) < 1 and abs(o.mean() - o_mean) < 1
    assert p.max() == p_max


@pytest.mark.parametrize("name,span,rate", [("azure_conv", 3502, 5.5), ("azure_code", 3436, 2.6)])
def test_azure_arrivals_span_the_hour(name, span, rate):
    trace = load(name=name, num_requests=0)
    t = arrivals(trace)
    assert t[0] == 0.0
    assert abs(t[-1] - span) < 1
    assert abs(len(t) / t[-1] - rate) < 0.06
    assert any("TIMESTAMP minus the earliest" in n for n in trace.notes)


def test_mooncake_arrivals_are_ms_in_seconds():
    trace = load(name="mooncake_conversation", num_requests=1000)
    raw = [json.loads(line) for _, line in zip(range(1000), open(TRACE_DIR / "mooncake_conversation.jsonl"))]
    assert np.allclose(arrivals(trace), [r["timestamp"] / 1000 for r in raw])
    assert [len(r.prompt_ids) for r in trace.requests] == [r["input_length"] for r in raw]
    assert [r.output_len for r in trace.requests] == [r["output_length"] for r in raw]


def test_time_scale_multiplies_trace_timestamps():
    a = arrivals(load(name="azure_code", num_requests=100))
    b = arrivals(load(name="azure_code", num_requests=100, time_scale=0.5))
    assert np.allclose(b, a * 0.5)


def test_num_requests_takes_the_first_rows_in_time():
    for name in ("azure_conv", "mooncake_synthetic"):
        small, big = load(name=name, num_requests=50), load(name=name, num_requests=120)
        for r, s in zip(small.requests, big.requests):
            assert r.arrival_s == s.arrival_s and np.array_equal(r.prompt_ids, s.prompt_ids)


def test_shuffle_flag_and_file_order():
    kept = load(name="sharegpt", num_requests=20, shuffle=False)
    head = pd.read_csv(TRACE_DIR / "sharegpt_8k.csv", nrows=20)
    assert lens(kept)[0].tolist() == head["num_prefill_tokens"].tolist()
    assert lens(kept)[1].tolist() == head["num_decode_tokens"].tolist()
    assert any("file order" in n for n in kept.notes)
    mixed = load(name="sharegpt", num_requests=20, shuffle=True)
    assert lens(mixed)[0].tolist() != head["num_prefill_tokens"].tolist()
    assert any("shuffled" in n for n in mixed.notes)


# ---------------------------------------------------------------- determinism

@pytest.mark.parametrize("name", ["sharegpt", "azure_conv", "mooncake_synthetic", "synthetic"])
def test_same_seed_same_trace_other_seed_differs(name):
    a, b = load(name=name, num_requests=100, seed=3), load(name=name, num_requests=100, seed=3)
    c = load(name=name, num_requests=100, seed=4)
    assert np.array_equal(arrivals(a), arrivals(b))
    assert all(np.array_equal(x.prompt_ids, y.prompt_ids) for x, y in zip(a.requests, b.requests))
    assert [x.output_len for x in a.requests] == [y.output_len for y in b.requests]
    same_ids = sum(np.array_equal(x.prompt_ids, y.prompt_ids) for x, y in zip(a.requests, c.requests))
    assert same_ids == 0
    if name != "azure_conv" and not name.startswith("mooncake"):  # trace times do not depend on the seed
        assert not np.array_equal(arrivals(a), arrivals(c))


def test_independent_requests_share_no_prefix():
    trace = load(name="bwb", num_requests=200)
    firsts = {tuple(r.prompt_ids[:4]) for r in trace.requests}
    assert len(firsts) == 200


# ---------------------------------------------------------------- synthesized arrivals

def gaps(trace: Trace) -> np.ndarray:
    return np.diff(arrivals(trace))


def test_poisson_rate_is_right():
    trace = load(name="synthetic", num_requests=5000, rate=10.0, burstiness=1.0, seed=1)
    g = gaps(trace)
    assert trace.requests[0].arrival_s == 0.0
    assert abs(g.mean() - 0.1) < 0.005
    assert abs(g.std() / g.mean() - 1.0) < 0.05
    assert any("Poisson 10 req/s" in n for n in trace.notes)


@pytest.mark.parametrize("shape", [0.25, 4.0])
def test_burstiness_sets_the_cv(shape):
    g = gaps(load(name="sharegpt", num_requests=5000, rate=2.0, burstiness=shape))
    assert abs(g.mean() - 0.5) < 0.05
    assert abs(g.std() / g.mean() - 1 / math.sqrt(shape)) < 0.15


def test_infinite_rate_puts_everything_at_zero():
    assert np.all(arrivals(load(name="arxiv", num_requests=50, rate=float("inf"))) == 0)
    assert np.all(arrivals(load(name="arxiv", num_requests=50, rate="inf")) == 0)


# ---------------------------------------------------------------- prefix sharing

def common_blocks(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("name", ["mooncake_synthetic", "mooncake_conversation"])
def test_mooncake_equal_hash_prefixes_give_equal_id_prefixes(name):
    n = 150
    trace = load(name=name, num_requests=n)
    raw = [json.loads(line) for _, line in zip(range(n), open(TRACE_DIR / f"{name}.jsonl"))]
    shared_pairs = 0
    for i in range(n):
        for j in range(i + 1, n):
            c = common_blocks(raw[i]["hash_ids"], raw[j]["hash_ids"])
            a, b = trace.requests[i].prompt_ids, trace.requests[j].prompt_ids
            m = min(c * 512, len(a), len(b))
            assert np.array_equal(a[:m], b[:m])
            if c < min(len(raw[i]["hash_ids"]), len(raw[j]["hash_ids"])):  # the next block differs
                nxt = slice(c * 512, min(c * 512 + 512, len(a), len(b)))
                assert not np.array_equal(a[nxt], b[nxt])
            shared_pairs += c > 0
    assert shared_pairs > 10


def test_mooncake_block_expansion_does_not_depend_on_other_rows():
    a = load(name="mooncake_conversation", num_requests=3)
    b = load(name="mooncake_conversation", num_requests=40)
    # rows 0 and 3 both start with hash 0: the first 512 ids agree across loads and requests
    assert np.array_equal(a.requests[0].prompt_ids[:512], b.requests[3].prompt_ids[:512])


def test_synthetic_prefix_groups():
    trace = load(name="synthetic", num_requests=300, num_prefix_groups=4, prefix_len=100,
                 prompt_len_min=150, prompt_len_max=400)
    heads = {}
    for r in trace.requests:
        heads.setdefault(tuple(r.prompt_ids[:100]), []).append(r.prompt_ids[100:110])
    assert len(heads) == 4
    tails = [tuple(t) for ts in heads.values() for t in ts]
    assert len(set(tails)) == len(tails)  # after the prefix, nothing is shared
    p, o = lens(trace)
    assert p.min() >= 150 and p.max() <= 400


def test_synthetic_without_groups_shares_nothing():
    trace = load(name="synthetic", num_requests=100, prefix_len=32, prompt_len_min=40)
    assert len({tuple(r.prompt_ids[:8]) for r in trace.requests}) == 100


# ---------------------------------------------------------------- over-context rule

def test_reject_marks_but_keeps():
    plain = load(name="sharegpt", num_requests=500)
    trace = load(name="sharegpt", num_requests=500, max_context=4096, over_context="reject")
    p, o = lens(plain)
    over = np.flatnonzero(p + o > 4096).tolist()
    assert len(trace) == 500 and len(over) > 0
    assert trace.over_context == {"rule": "reject", "count": len(over), "rids": over, "max_context": 4096}
    assert np.array_equal(lens(trace)[0], p)
    assert any("rule reject" in n for n in trace.notes)


def test_truncate_cuts_prompts_keeping_the_first_tokens():
    plain = load(name="mooncake_synthetic", num_requests=200)
    trace = load(name="mooncake_synthetic", num_requests=200, max_context=8192, over_context="truncate")
    p0, o0 = lens(plain)
    p, o = lens(trace)
    over = np.flatnonzero(p0 + o0 > 8192).tolist()
    assert trace.over_context["count"] == len(over) > 0 and trace.over_context["rids"] == over
    assert np.all(p + o <= 8192) and np.array_equal(o, o0)
    for x, y in zip(trace.requests, plain.requests):
        assert np.array_equal(x.prompt_ids, y.prompt_ids[: len(x.prompt_ids)])
    assert any("rule truncate" in n for n in trace.notes)


def test_truncate_cuts_output_when_output_alone_is_too_long():
    trace = load(name="synthetic", num_requests=20, prompt_len_min=10, prompt_len_max=20,
                 output_len_min=100, output_len_max=200, max_context=100, over_context="truncate")
    p, o = lens(trace)
    assert trace.over_context["count"] == 20
    assert np.all(p + o <= 100) and np.all(o <= 99) and np.all(p >= 1)


@settings(max_examples=40, deadline=None)
@given(max_context=st.integers(2, 3000), rule=st.sampled_from(["reject", "truncate"]))
def test_over_context_invariants(max_context, rule):
    trace = load(name="synthetic", num_requests=30, prompt_len_min=1, prompt_len_max=2000,
                 output_len_min=1, output_len_max=1500, max_context=max_context, over_context=rule,
                 seed=max_context)
    p, o = lens(trace)
    base_p, base_o = lens(load(name="synthetic", num_requests=30, prompt_len_min=1, prompt_len_max=2000,
                               output_len_min=1, output_len_max=1500, seed=max_context))
    over = np.flatnonzero(base_p + base_o > max_context).tolist()
    assert trace.over_context["rids"] == over
    if rule == "truncate":
        assert np.all(p + o <= max_context) and np.all(p >= 1) and np.all(o >= 1)
    else:
        assert np.array_equal(p, base_p) and np.array_equal(o, base_o)


def test_nan_is_reported_as_nan_and_an_empty_cell_as_empty(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    (tmp_path / "a.csv").write_text("prompt_tokens,output_tokens\n100,10\nnan,5\n,6\n")
    (tmp_path / "a.jsonl").write_text('{"prompt_tokens": 100, "output_tokens": 10}\n'
                                      '{"prompt_tokens": NaN, "output_tokens": 5}\n')
    pq.write_table(pa.table({"prompt_tokens": pa.array([100.0, float("nan"), None]),
                             "output_tokens": pa.array([10, 5, 6])}), tmp_path / "a.parquet")
    for suffix, shown in ((".csv", "value 'nan'"), (".jsonl", "value 'NaN'"), (".parquet", "value 'NaN'")):
        with pytest.raises(TraceError, match=f"row 2.*prompt_tokens.*{shown} is not an integer|"
                                             f"line 2.*prompt_tokens.*{shown} is not an integer"):
            load(name="file", path=str(tmp_path / f"a{suffix}"))
    (tmp_path / "b.csv").write_text("prompt_tokens,output_tokens\n100,10\n,6\n")
    with pytest.raises(TraceError, match="row 2.*an empty value is not an integer"):
        load(name="file", path=str(tmp_path / "b.csv"))


def test_rejected_prompts_get_no_token_ids(tmp_path):
    """A prompt over the context (rule reject) is kept as a length: its ids are never made, so
    a 1e9-token row costs nothing (it took a 7.45 GiB allocation before); the others' ids are
    the same as without it."""
    rows = pd.DataFrame({"prompt_tokens": [100, 1_000_000_000, 200], "output_tokens": [10, 5, 20]})
    t = load(name="file", path=str(write(rows, tmp_path / "t.csv")), max_context=4096)
    assert [r.prompt_len for r in t.requests] == [100, 1_000_000_000, 200]
    assert t.requests[1].prompt_ids is None and t.over_context["rids"] == [1]
    small = load(name="file", path=str(write(rows.iloc[[0, 2]], tmp_path / "s.csv")), max_context=4096)
    assert np.array_equal(t.requests[0].prompt_ids, small.requests[0].prompt_ids)
    truncated = load(name="file", path=str(write(rows, tmp_path / "t.csv")), max_context=4096,
                     over_context="truncate")
    assert all(r.prompt_ids is not None and len(r.prompt_ids) == r.prompt_len for r in truncated.requests)


# ---------------------------------------------------------------- config objects

def test_config_as_dataclass_namespace_or_mapping():
    a = load_trace(TraceConfig(name="bwb", num_requests=30))
    b = load_trace(SimpleNamespace(name="bwb", num_requests=30))
    c = load_trace({"name": "bwb", "num_requests": 30})
    d = load_trace(TraceConfig(name="bwb"), num_requests=30)
    for t in (b, c, d):
        assert np.array_equal(arrivals(a), arrivals(t))
        assert all(np.array_equal(x.prompt_ids, y.prompt_ids) for x, y in zip(a.requests, t.requests))
    assert len(load_trace(SimpleNamespace(name="bwb"))) == 1000  # default num_requests


# ---------------------------------------------------------------- user files

def write(df: pd.DataFrame, path: Path) -> Path:
    if path.suffix == ".csv":
        df.to_csv(path, index=False)
    elif path.suffix == ".jsonl":
        with open(path, "w") as f:
            for rec in df.to_dict(orient="records"):
                f.write(json.dumps({k: v for k, v in rec.items()
                                    if not (isinstance(v, float) and math.isnan(v))}) + "\n")
    else:
        df.to_parquet(path, index=False)
    return path


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_file_with_exact_prompt_ids(tmp_path, suffix):
    ids = [[5, 6, 7], [1], [9, 8, 7, 6, 5, 4]]
    df = pd.DataFrame({
        "prompt_ids": [json.dumps(x) if suffix == ".csv" else x for x in ids],
        "output_tokens": [4, 2, 9],
        "arrival_s": [2.0, 0.5, 1.0],
        "priority": [1, 0, 2],
    })
    trace = load(name="file", path=str(write(df, tmp_path / f"t{suffix}")))
    check_well_formed(trace)
    order = [1, 2, 0]  # by arrival
    assert [r.prompt_ids.tolist() for r in trace.requests] == [ids[i] for i in order]
    assert [r.output_len for r in trace.requests] == [2, 9, 4]
    assert [r.priority for r in trace.requests] == [0, 2, 1]
    assert arrivals(trace).tolist() == [0.0, 0.5, 1.5]  # shifted: the first arrival at 0
    assert any("sorted by arrival" in n for n in trace.notes)


def test_file_csv_space_separated_ids_and_mixed_rows(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("prompt_ids,prompt_tokens,output_tokens\n3 4 5,,7\n,12,3\n\"[1, 2]\",2,1\n")
    trace = load(name="file", path=str(p), rate=1.0)
    assert [len(r.prompt_ids) for r in trace.requests] == [3, 12, 2]
    assert trace.requests[0].prompt_ids.tolist() == [3, 4, 5]
    assert arrivals(trace).tolist() == [0.0, arrivals(trace)[1], arrivals(trace)[2]]
    assert any("arrivals synthesized" in n for n in trace.notes)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_file_prefix_ids_share_blocks(tmp_path, suffix):
    pref = [[1, 2, 3], [1, 2, 9], [7]]
    df = pd.DataFrame({
        "prompt_tokens": [40, 35, 20],
        "output_tokens": [1, 1, 1],
        "prefix_ids": [" ".join(map(str, x)) if suffix == ".csv" else x for x in pref],
    })
    trace = load(name="file", path=str(write(df, tmp_path / f"t{suffix}")), block_size=16)
    a, b, c = (r.prompt_ids for r in trace.requests)
    assert len(a) == 40 and len(b) == 35 and len(c) == 20  # c is padded past its one block
    assert np.array_equal(a[:32], b[:32]) and not np.array_equal(a[32:35], b[32:35])
    assert not np.array_equal(a[:16], c[:16])


@pytest.mark.parametrize("first", [-1.0, 1.73e9])  # a negative offset, a Unix timestamp
def test_file_times_are_shifted_to_start_at_zero(tmp_path, first):
    df = pd.DataFrame({"prompt_tokens": [3, 4], "output_tokens": [1, 1], "arrival_s": [first, first + 3.0]})
    trace = load(name="file", path=str(write(df, tmp_path / "t.csv")), time_scale=2.0)
    assert arrivals(trace).tolist() == [0.0, 6.0]
    assert any("shifted" in n for n in trace.notes)


@pytest.mark.parametrize("column", [
    pd.to_datetime(["2024-05-01 10:00:00.0", "2024-05-02 10:00:00.0", "2024-05-01 10:00:01.5"], format="ISO8601"),
    pd.to_datetime(["2024-05-01 10:00:00.0", "2024-05-02 10:00:00.0", "2024-05-01 10:00:01.5"], format="ISO8601").tz_localize("UTC"),
    pd.to_timedelta([0, 86400, 1.5], unit="s"),
])
def test_file_parquet_timestamps_and_durations_are_seconds(tmp_path, column):
    df = pd.DataFrame({"prompt_tokens": [3, 4, 5], "output_tokens": [1, 1, 1], "arrival_s": column})
    trace = load(name="file", path=str(write(df, tmp_path / "t.parquet")))
    assert arrivals(trace).tolist() == [0.0, 1.5, 86400.0]  # a day is 86,400 s, not 8.64e10


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 50),
                               st.floats(0, 100, allow_nan=False)), min_size=1, max_size=40),
       take=st.integers(0, 50))
def test_file_every_row_taken_becomes_a_request(tmp_path, rows, take):
    df = pd.DataFrame(rows, columns=["prompt_tokens", "output_tokens", "arrival_s"])
    path = write(df, tmp_path / "h.csv")
    trace = load(name="file", path=str(path), num_requests=take)
    check_well_formed(trace)
    expected = df.sort_values("arrival_s", kind="stable")
    if take:
        expected = expected.head(take)
    assert len(trace) == len(expected)
    assert lens(trace)[0].tolist() == expected["prompt_tokens"].tolist()
    assert lens(trace)[1].tolist() == expected["output_tokens"].tolist()
    assert np.allclose(arrivals(trace), expected["arrival_s"] - df["arrival_s"].min())  # the first arrival at 0


def test_azure_seven_digit_fractions(tmp_path):
    p = tmp_path / "az.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:17:03.9799600,10,2\n2023-11-16 18:17:03.9799601,11,3\n"
                 "2023-11-16 18:17:05.0000000,12,4\n")
    t = arrivals(load(name="azure_code", path=str(p)))
    assert abs(t[1] - 1e-7) < 1e-12 and abs(t[2] - 1.02004) < 1e-9


# ---------------------------------------------------------------- errors

def raises(match: list[str], **kw) -> str:
    with pytest.raises(TraceError) as err:
        load(**kw)
    msg = str(err.value)
    assert "\n" not in msg
    for m in match:
        assert m in msg, (m, msg)
    return msg


def test_values_are_shown_as_written(tmp_path):
    df = pd.DataFrame({"prompt_tokens": [3, 4], "output_tokens": [1.0, 12.5]})
    msg = raises(["value 12.5 is not an integer"], name="file", path=str(write(df, tmp_path / "t.parquet")))
    assert "np." not in msg
    p = tmp_path / "big.csv"
    p.write_text(f"prompt_tokens,output_tokens\n3,1\n{2**63 + 5},1\n")
    raises([str(2**63 + 5), "prompt_tokens"], name="file", path=str(p))


def test_unknown_name_lists_known_ones():
    msg = raises(["trace.name='sharegtp' is unknown; allowed: arxiv, azure_code"], name="sharegtp")
    assert msg.endswith("mooncake_synthetic, sharegpt, synthetic")


@pytest.mark.parametrize("knob,value", [
    ("rate", 0), ("rate", -1.0), ("burstiness", 0), ("burstiness", float("inf")), ("num_requests", -1),
    ("num_requests", 2.5), ("time_scale", 0), ("over_context", "drop"), ("block_size", 0),
    ("vocab_size", 1), ("max_context", 1), ("seed", -3), ("shuffle", "maybe"),
])
def test_bad_knobs(knob, value):
    raises([knob, repr(value)], name="sharegpt", **{knob: value})


@pytest.mark.parametrize("knob,value", [("prompt_len_min", 0), ("output_len_max", 5), ("prefix_len", 500),
                                        ("num_prefix_groups", -1), ("num_requests", None)])
def test_bad_synthetic_knobs(knob, value):
    kw = dict(name="synthetic", num_requests=10, output_len_min=10, num_prefix_groups=2, prefix_len=64)
    kw[knob] = value
    raises([knob], **kw)


def test_missing_file_says_path_and_what_exists(tmp_path):
    (tmp_path / "other.csv").write_text("a\n1\n")
    msg = raises(["nope.csv", "other.csv"], name="file", path=str(tmp_path / "nope.csv"))
    assert str(tmp_path) in msg
    raises(["path"], name="file")


def test_missing_column(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("num_prefill_tokens,decode\n5,6\n")
    raises([str(p), "missing column 'num_decode_tokens'", "num_prefill_tokens, decode"], name="bwb", path=str(p))


@pytest.mark.parametrize("cell,what", [("12.5", "not an integer"), ("", "empty value"), ("abc", "not an integer"),
                                       ("0", "below the minimum 1"), ("-4", "below the minimum 1")])
def test_bad_length_cells_name_file_row_column(tmp_path, cell, what):
    p = tmp_path / "s.csv"
    p.write_text(f"num_prefill_tokens,num_decode_tokens\n5,6\n7,8\n9,{cell}\n")
    raises([str(p), "data row 3 (line 4", "column 'num_decode_tokens'", what], name="sharegpt", path=str(p))


def test_bad_azure_timestamp(tmp_path):
    p = tmp_path / "az.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,10,2\nyesterday,11,3\n")
    raises([str(p), "data row 2", "column 'TIMESTAMP'", "'yesterday'"], name="azure_conv", path=str(p))


def test_bad_mooncake_lines(tmp_path):
    p = tmp_path / "m.jsonl"
    good = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
    p.write_text(good + "\n" + '{"timestamp": 5, "input_length": 0, "output_length": 5, "hash_ids": [1]}\n')
    raises([str(p), "line 3", "column 'input_length'", "below the minimum 1"], name="mooncake_synthetic", path=str(p))
    p.write_text(good + '{"timestamp": 5, "input_length": 7, "output_length": 5, "hash_ids": "x"}\n')
    raises([str(p), "line 2", "column 'hash_ids'"], name="mooncake_synthetic", path=str(p))
    p.write_text(good + '{"timestamp": 5, "input_length": 7, "output_length": 5, "hash_ids": [1.5]}\n')
    raises([str(p), "line 2", "column 'hash_ids'"], name="mooncake_synthetic", path=str(p))
    p.write_text(good + '{"timestamp": 5, "input_length": 7,\n')
    raises([str(p), "line 2", "invalid JSON"], name="mooncake_synthetic", path=str(p))
    p.write_text(good + '{"timestamp": null, "input_length": 7, "output_length": 5, "hash_ids": [1]}\n')
    raises([str(p), "line 2", "column 'timestamp'"], name="mooncake_synthetic", path=str(p))


def test_bad_user_files(tmp_path):
    p = tmp_path / "u.csv"
    p.write_text("prompt_tokens,arrival_s\n5,0\n")
    raises([str(p), "missing column 'output_tokens'"], name="file", path=str(p))
    p.write_text("output_tokens\n5\n")
    raises([str(p), "missing column 'prompt_tokens'"], name="file", path=str(p))
    p.write_text("prompt_ids,output_tokens\n1 2,5\n[],5\n")
    raises([str(p), "data row 2", "column 'prompt_ids'", "empty list"], name="file", path=str(p))
    p.write_text("prompt_ids,output_tokens\n1 2,5\n1 x,5\n")
    raises([str(p), "data row 2", "column 'prompt_ids'"], name="file", path=str(p))
    p.write_text("prompt_ids,output_tokens\n1 2,5\n1 40000,5\n")
    raises([str(p), "data row 2", "column 'prompt_ids'", "vocab_size=32000"], name="file", path=str(p))
    p.write_text("prompt_ids,prompt_tokens,output_tokens\n1 2,3,5\n")
    raises([str(p), "data row 1", "column 'prompt_tokens'", "disagrees"], name="file", path=str(p))
    p.write_text("prompt_tokens,output_tokens,arrival_s\n4,5,0\n4,5,soon\n")
    raises([str(p), "data row 2", "column 'arrival_s'"], name="file", path=str(p))
    p.write_text("prompt_tokens,output_tokens\n4,5\n,5\n")
    raises([str(p), "data row 2", "column 'prompt_tokens'"], name="file", path=str(p))
    p.write_text("prompt_tokens,output_tokens\n")
    raises([str(p), "no data rows"], name="file", path=str(p))
    q = tmp_path / "u.txt"
    q.write_text("x")
    raises([str(q), "unknown file type"], name="file", path=str(q))
    j = tmp_path / "u.jsonl"
    j.write_text('{"prompt_tokens": 3, "output_tokens": 1}\n{"prompt_tokens": 3, "output_tokens": true}\n')
    raises([str(j), "line 2", "column 'output_tokens'"], name="file", path=str(j))
    pq = tmp_path / "u.parquet"
    pd.DataFrame({"prompt_tokens": [3, 0], "output_tokens": [1, 1]}).to_parquet(pq)
    raises([str(pq), "row 2 (1-based)", "column 'prompt_tokens'"], name="file", path=str(pq))


def test_file_jsonl_with_a_byte_order_mark(tmp_path):
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + b'{"prompt_tokens": 3, "output_tokens": 2}\n{"prompt_tokens": 4, "output_tokens": 1}\n')
    trace = load(name="file", path=str(p))
    assert lens(trace)[0].tolist() == [3, 4]


def test_keyed_runs_are_whole_per_request_and_held_a_chunk_at_a_time():
    """The ids of a request do not depend on the others asked with it, and far-apart requests'
    ids live in different buffers (a replay frees them as their requests finish)."""
    from testbed.traces import token_ids
    rids = np.arange(40, dtype=np.int64)
    lens = np.full(40, token_ids._CHUNK // 8, np.int64)  # 8 requests a chunk: 5 chunks
    runs = token_ids.unique_ids(7, rids, lens, 1000)
    alone = [token_ids.unique_ids(7, rids[i:i + 1], lens[i:i + 1], 1000)[0] for i in (0, 17, 39)]
    assert all(np.array_equal(runs[i], a) for i, a in zip((0, 17, 39), alone))
    assert [len(r) for r in runs] == lens.tolist()
    assert runs[0].base is not None and runs[0].base is runs[7].base and runs[0].base is not runs[39].base


@pytest.mark.parametrize("kw", [dict(name="sharegpt", num_requests=400), dict(name="azure_conv", num_requests=300),
                                dict(name="synthetic", num_requests=300, num_prefix_groups=4, prefix_len=64),
                                dict(name="sharegpt", num_requests=50, max_context=2048, over_context="reject")])
def test_lazy_ids_are_the_makers_in_any_order(kw, monkeypatch):
    """A pure id maker's ids are made when first read, a window at a time: read in any order
    (a window made again after its ids were handed over) they are what one call makes for all."""
    import testbed.traces.lazy_ids as lazy
    monkeypatch.setattr(lazy, "WINDOW_TOKENS", 3000)  # many windows, each of a few requests
    trace = load(**kw)
    src = next(r.id_source for r in trace.requests if r.id_source is not None)
    assert all(r.made_ids is None for r in trace.requests)  # nothing made up front
    eager = lazy.IdWindows(src.name, src.make_ids, src.take, src.rids, src.lens, src.runs, math.inf)
    order = np.random.default_rng(0).permutation(len(trace.requests))
    for i in order.tolist():
        r = trace.requests[i]
        want = eager.ids(r.rid)
        got = r.prompt_ids
        assert (got is None) == (want is None)
        if got is not None:
            assert got.dtype == np.int32 and np.array_equal(got, want) and len(got) == r.prompt_len
    assert src.hi - src.lo < len(trace.requests)  # windows, not the whole trace


def test_a_replay_makes_ids_as_requests_arrive():
    """The scheduler's requests of a lazy trace get their ids when the feed admits them."""
    from testbed.assemble import requests_from
    from testbed.config import EngineConfig
    from testbed.steploop import TraceFeed
    trace = load(name="sharegpt", num_requests=30, rate=2.0)
    reqs = requests_from(trace, SimpleNamespace(eos_token_ids=(), max_context=1 << 17), EngineConfig())
    assert all(r.prompt_ids is None and r.ids_source is not None for r in reqs)
    feed = TraceFeed(reqs)
    added = []
    feed.admit(SimpleNamespace(add_request=lambda r, now: added.append(r)), reqs[9].arrival)
    assert len(added) >= 10 and all(r.prompt_ids is not None and r.ids_source is None for r in added)
    assert all(r.prompt_ids is None for r in reqs[len(added):])
    assert np.array_equal(added[3].prompt_ids, trace.requests[3].prompt_ids)


def test_a_replay_makes_each_request_as_it_arrives():
    """A trace's Requests are made as the feed reads them (arrivals), equal to ones made up front."""
    from testbed.assemble import requests_from
    from testbed.config import EngineConfig
    from testbed.steploop import TraceFeed
    spec = SimpleNamespace(eos_token_ids=(2,), max_context=1 << 17)
    trace = load(name="sharegpt", num_requests=30, rate=2.0)
    reqs = requests_from(trace, spec, EngineConfig())
    assert len(reqs) == 30 and reqs.made() == [] and reqs.in_arrival_order
    feed = TraceFeed(reqs)
    assert feed.requests is reqs and [r.rid for r in reqs.made()] == [0]  # not sorted: only the first is made
    added = []
    feed.admit(SimpleNamespace(add_request=lambda r, now: added.append(r)), trace.requests[9].arrival_s)
    made = reqs.made()
    assert [r.rid for r in added] == list(range(len(added))) and len(added) >= 10
    assert [r.rid for r in made] == list(range(len(added) + 1))  # and the next one, whose arrival was read
    assert feed.next_arrival() == made[-1].arrival and made[-1].prompt_ids is None  # its ids: when it arrives
    eager = list(requests_from(load(name="sharegpt", num_requests=30, rate=2.0), spec, EngineConfig()))
    for r in eager:
        r.make_ids()
    for a, b in zip(added, eager):
        assert (a.rid, a.arrival, a.prompt_len, a.max_new_tokens, a.eos_token_ids, a.sampling) == (
            b.rid, b.arrival, b.prompt_len, b.max_new_tokens, b.eos_token_ids, b.sampling)
        assert np.array_equal(a.prompt_ids, b.prompt_ids)


def test_a_loaders_rows_are_made_as_read_and_kept():
    """Trace.requests of a loader: each TraceRequest made on first read, the same object after
    (what is set on it stays), indexable as a list, in rid order."""
    trace = load(name="synthetic", num_requests=50, rate=5.0)
    rows = trace.requests
    assert len(rows) == 50 and rows[7] is rows[7] and rows[-1] is rows[49] and rows[2:4] == [rows[2], rows[3]]
    assert [r.rid for r in rows] == list(range(50))
    assert np.array_equal(rows.arrival_s, [r.arrival_s for r in rows]) and (np.diff(rows.arrival_s) >= 0).all()
    ids = rows[3].prompt_ids
    assert ids is not None and len(ids) == rows[3].prompt_len
    rows[3].prompt_ids = None
    assert rows[3].prompt_ids is None
    with pytest.raises(IndexError):
        rows[50]


def test_a_trace_out_of_arrival_order_is_replayed_in_arrival_order():
    """Rows not in (arrival, rid) order (a trace built by hand): the feed sorts them, as before."""
    from testbed.assemble import requests_from
    from testbed.config import EngineConfig
    from testbed.steploop import TraceFeed
    from testbed.traces.base import TraceRequest
    rows = [TraceRequest(rid=i, arrival_s=a, prompt_len=4, output_len=2, made_ids=np.arange(4, dtype=np.int32))
            for i, a in enumerate([0.5, 0.1, 0.3])]
    reqs = requests_from(Trace(name="hand", requests=rows), SimpleNamespace(eos_token_ids=(), max_context=64),
                         EngineConfig())
    assert not reqs.in_arrival_order
    assert [r.rid for r in TraceFeed(reqs).requests] == [1, 2, 0]


def test_bad_sampling_settings_fail_before_the_replay():
    from testbed.assemble import requests_from
    from testbed.config import EngineConfig
    with pytest.raises(ValueError, match="top_p"):
        requests_from(load(name="sharegpt", num_requests=3), SimpleNamespace(eos_token_ids=(), max_context=1 << 17),
                      EngineConfig(top_p=0.0))
