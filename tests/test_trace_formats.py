"""A user's trace file in the formats other tools share (testbed/traces/user_file.py):
Mooncake / AIPerf JSONL, BurstGPT CSV, vllm bench's ShareGPT JSON; format detection, the
example files in traces/examples/ run end to end, and one-line errors on bad input."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.traces import TRACE_DIR, TraceError, load_trace

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = TRACE_DIR / "examples"


def load(path, **kw):
    return load_trace(dict(name="file", path=str(path), **kw))


def raises(match: list[str], path, **kw) -> str:
    with pytest.raises(TraceError) as err:
        load(path, **kw)
    msg = str(err.value)
    assert "\n" not in msg
    for m in match:
        assert m in msg, (m, msg)
    return msg


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# ---- the example files, end to end through the CLI ----------------------------------------------
@pytest.mark.parametrize("name,fmt,rows", [("mooncake_example.jsonl", "mooncake", 10),
                                           ("burstgpt_example.csv", "burstgpt", 9),
                                           ("sharegpt_example.json", "sharegpt", 4)])
def test_example_file_runs_end_to_end(tmp_path, name, fmt, rows):
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "testbed.run", "trace=file", f"trace.path=traces/examples/{name}",
                        "progress=false", f"hydra.run.dir={out}"], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert f"format: {fmt}" in (out / "run.log").read_text()
    req = pd.read_parquet(out / "requests.parquet")
    assert len(req) == rows and (req["state"] == "FINISHED").all()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["trace"]["format"] == "auto"
    if fmt == "mooncake":  # the shared system-prompt blocks and turns are found in the prefix cache
        assert req["prefix_cached_tokens"].sum() > 0


# ---- Mooncake / AIPerf ----------------------------------------------------------------------------
def test_mooncake_file_shares_prefix_blocks_and_takes_ms_times():
    t = load(EXAMPLES / "mooncake_example.jsonl")
    raw = [json.loads(line) for line in (EXAMPLES / "mooncake_example.jsonl").read_text().splitlines()]
    assert [r.arrival_s for r in t] == [x["timestamp"] / 1000 for x in raw]
    assert [r.prompt_len for r in t] == [x["input_length"] for x in raw]
    assert [r.output_len for r in t] == [x["output_length"] for x in raw]
    ids = [r.prompt_ids for r in t]
    # rows 0 and 2 share blocks [0, 1, 2]: 1,400 tokens of row 0, all of it
    assert common_prefix(ids[0], ids[2]) == 1400
    # rows 1 and 4 share [100, 101, 10, 11]: the whole of row 1's 1,800 tokens
    assert common_prefix(ids[1], ids[4]) == 1800
    # rows 7 and 9 share the system prompt [100, 101] and block 40: 1,100 tokens
    assert common_prefix(ids[7], ids[9]) == 1100
    assert common_prefix(ids[0], ids[1]) < 5  # different first blocks: nothing shared (ids coincide by chance only)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=5), st.integers(0, 3)),
                min_size=2, max_size=6))
def test_mooncake_ids_share_exactly_the_common_block_prefix(tmp_path, rows):
    """Two requests' ids agree on exactly their common leading hash_ids blocks (cut to their lengths)."""
    block = 4
    records = [{"timestamp": i * 10, "input_length": (len(h) - 1) * block + 1 + cut, "output_length": 2,
                "hash_ids": h} for i, (h, cut) in enumerate(rows)]
    path = jsonl(tmp_path / "m.jsonl", records)
    t = load(path, block_size=block, vocab_size=2**31 - 1)  # a large vocabulary: no chance coincidences
    for a in range(len(records)):
        for b in range(a + 1, len(records)):
            ha, hb = records[a]["hash_ids"], records[b]["hash_ids"]
            same = next((i for i, (x, y) in enumerate(zip(ha, hb)) if x != y), min(len(ha), len(hb)))
            la, lb = records[a]["input_length"], records[b]["input_length"]
            assert common_prefix(t.requests[a].prompt_ids, t.requests[b].prompt_ids) == min(same * block, la, lb)


def test_aiperf_file_without_timestamps_or_hash_ids(tmp_path):
    path = jsonl(tmp_path / "a.jsonl", [{"input_length": 100, "output_length": 5, "session_id": "s1"},
                                        {"input_length": 80, "output_length": 3, "session_id": "s1"}])
    t = load(path, rate=2.0)
    assert [r.prompt_len for r in t] == [100, 80] and t.requests[0].arrival_s == 0
    assert common_prefix(t.requests[0].prompt_ids, t.requests[1].prompt_ids) < 3
    notes = " | ".join(t.notes)
    assert "format: mooncake" in notes and "arrivals synthesized" in notes
    assert "columns not read by this format: session_id" in notes and "no hash_ids column" in notes


def test_mooncake_file_errors_name_file_line_and_field(tmp_path):
    good = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}
    p = tmp_path / "m.jsonl"
    p.write_text(json.dumps(good) + "\n\n" + json.dumps({**good, "output_length": "many"}) + "\n")
    raises([str(p), "line 3", "column 'output_length'", "'many'"], p)
    jsonl(p, [good, {**good, "hash_ids": [1, "b"]}])
    raises([str(p), "line 2", "column 'hash_ids'"], p)
    jsonl(p, [good, {**good, "timestamp": "noon"}])
    raises([str(p), "line 2", "column 'timestamp'"], p)
    jsonl(p, [{"timestamp": 0, "output_length": 5}])
    raises([str(p), "missing column 'input_length'"], p, format="mooncake")


# ---- BurstGPT -------------------------------------------------------------------------------------
def test_burstgpt_file_leaves_out_failed_rows_and_shifts_times():
    df = pd.read_csv(EXAMPLES / "burstgpt_example.csv")
    ok = df[df["Response tokens"] > 0]
    t = load(EXAMPLES / "burstgpt_example.csv")
    assert [r.prompt_len for r in t] == ok["Request tokens"].tolist()
    assert [r.output_len for r in t] == ok["Response tokens"].tolist()
    assert [r.arrival_s for r in t] == (ok["Timestamp"] - df["Timestamp"].min()).astype(float).tolist()
    notes = " | ".join(t.notes)
    assert "1 of 10 rows have Response tokens 0" in notes and "Model: ChatGPT 6, GPT-4 3" in notes
    assert t.rows == 9


def test_burstgpt_errors_name_file_line_and_column(tmp_path):
    p = tmp_path / "b.csv"
    head = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    p.write_text(head + "1,ChatGPT,10,5,15,API log\n2,ChatGPT,ten,5,15,API log\n")
    raises([str(p), "data row 2 (line 3", "column 'Request tokens'", "'ten'"], p)
    p.write_text(head + "1,ChatGPT,10,5,15,API log\n2,ChatGPT,0,5,5,API log\n")
    raises([str(p), "data row 2", "column 'Request tokens'", "below the minimum 1"], p)
    p.write_text(head + "1,ChatGPT,10,5,15,API log\nlater,ChatGPT,10,5,15,API log\n")
    raises([str(p), "data row 2", "column 'Timestamp'"], p)
    p.write_text(head + "1,ChatGPT,10,0,10,API log\n")
    raises([str(p), "every row has Response tokens 0"], p)
    p.write_text("Timestamp,Request tokens\n1,10\n")
    raises([str(p), "missing column 'Response tokens'"], p, format="burstgpt")


# ---- ShareGPT (vllm bench) ------------------------------------------------------------------------
def test_sharegpt_file_estimates_tokens_from_characters():
    data = json.loads((EXAMPLES / "sharegpt_example.json").read_text())
    t = load(EXAMPLES / "sharegpt_example.json", shuffle=False)
    pairs = [(c["conversations"][0], c["conversations"][1]) for c in data[:2]] + \
            [(c["conversations"][1], c["conversations"][2]) for c in data[3:4]] + \
            [(c["conversations"][0], c["conversations"][1]) for c in data[4:]]
    assert [r.prompt_len for r in t] == [math.ceil(len(h["value"]) / 4) for h, _ in pairs]
    assert [r.output_len for r in t] == [math.ceil(len(g["value"]) / 4) for _, g in pairs]
    assert "1 of 5 conversations have no human turn followed by a gpt turn" in " | ".join(t.notes)
    t3 = load(EXAMPLES / "sharegpt_example.json", shuffle=False, chars_per_token=3.0)
    assert t3.requests[0].prompt_len == math.ceil(len(pairs[0][0]["value"]) / 3)


@pytest.fixture
def tokenizer_file(tmp_path) -> Path:
    """A small word-level tokenizer with a BOS token, written as tokenizer.json."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, processors
    words = "<unk> <s> what is the difference between a process and thread ? keep it short".split()
    tok = tokenizers.Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    path = tmp_path / "tok" / "tokenizer.json"
    path.parent.mkdir()
    tok.save(str(path))
    return path


def test_sharegpt_file_with_a_tokenizer_gives_its_ids(tmp_path, tokenizer_file):
    path = tmp_path / "s.json"
    path.write_text(json.dumps([
        {"id": "a", "conversations": [{"from": "human", "value": "what is a thread ?"},
                                      {"from": "gpt", "value": "a thread is a process , short"}]},
        {"id": "b", "conversations": [{"from": "human", "value": "keep it short"}, {"from": "gpt", "value": "it"}]},
    ]))
    t = load(path, tokenizer=str(tokenizer_file.parent), shuffle=False)  # the folder holding tokenizer.json
    # BOS (1) first, then the words' ids; the reply counted without special tokens
    assert t.requests[0].prompt_ids.tolist() == [1, 2, 3, 7, 10, 11]
    assert t.requests[0].output_len == 7  # "," is unknown: one <unk> token
    assert t.requests[1].prompt_ids.tolist() == [1, 12, 13, 14] and t.requests[1].output_len == 1
    assert any(f"tokenizer {tokenizer_file}" in n for n in t.notes)
    # a model vocabulary smaller than the tokenizer's ids
    raises(["trace.tokenizer", "token id 14", "[0, 10)"], path, tokenizer=str(tokenizer_file), vocab_size=10)
    raises(["trace.tokenizer", "not found"], path, tokenizer=str(tmp_path / "nothing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    raises(["trace.tokenizer", str(bad), "not a readable tokenizer.json"], path, tokenizer=str(bad))


def test_sharegpt_errors_name_file_line_and_field(tmp_path):
    p = tmp_path / "s.json"
    ok = '{"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}'
    p.write_text("[\n" + ok + ",\n" + ok + ",\n" + '{"id": "c", "conversations": [{"from": "human", "value": 3}]}\n]\n')
    raises([str(p), "line 4 (entry 3)", "field 'conversations[0].value'", "a int, not a string"], p)
    p.write_text("[\n" + ok + ",\n" + '{"id": "c"}\n]')
    raises([str(p), "line 3 (entry 2)", "field 'conversations' is missing"], p)
    p.write_text("[\n" + ok + ",\n" + '"just text"\n]')
    raises([str(p), "line 3 (entry 2)", "expected an object"], p)
    p.write_text("[\n" + ok + ",\n" + '{"id": "c", "conversations": [{"from": "human" "value": "x"}]}\n]')
    raises([str(p), "line 3", "invalid JSON"], p)
    p.write_text("[\n" + ok + "\n" + ok + "\n]")
    raises([str(p), "line 3", "expected ',' or ']'"], p)
    p.write_text("[]")
    raises([str(p), "no conversations"], p)
    p.write_text(json.dumps([{"conversations": [{"from": "gpt", "value": "x"}]}]))
    raises([str(p), "none of its 1 conversations"], p)
    p.write_text(json.dumps([{"conversations": [{"from": "human", "value": ""}, {"from": "gpt", "value": "x"}]}]))
    raises([str(p), "every conversation has an empty prompt or reply"], p)
    p.write_text(json.dumps({"conversations": []}))
    raises([str(p), "not a JSON array"], p, format="sharegpt")


# ---- format detection and the format key ----------------------------------------------------------
def test_format_key_overrides_detection_and_is_checked(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("prompt_tokens,output_tokens,input_length,output_length\n5,2,7,3\n")
    assert load(p).requests[0].prompt_len == 7  # detected as mooncake by input_length
    t = load(p, format="testbed")
    assert t.requests[0].prompt_len == 5 and "columns not read by this format: input_length, output_length" in " | ".join(t.notes)
    raises(["format='csv' is not allowed", "auto, testbed, mooncake, burstgpt, sharegpt"], p, format="csv")
    with pytest.raises(TraceError, match="applies to name=file only"):
        load_trace(dict(name="sharegpt", format="burstgpt"))
    raises([str(EXAMPLES / "sharegpt_example.json"), "read as trace.format=sharegpt, not burstgpt"],
           EXAMPLES / "sharegpt_example.json", format="burstgpt")
    raises(["chars_per_token", "0"], EXAMPLES / "sharegpt_example.json", chars_per_token=0)


def test_format_and_tokenizer_from_the_command_line(tmp_path, tokenizer_file):
    path = tmp_path / "s.json"
    path.write_text(json.dumps([{"conversations": [{"from": "human", "value": "keep it short"},
                                                   {"from": "gpt", "value": "it is"}]}]))
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "testbed.run", "trace=file", f"trace.path={path}",
                        "trace.format=sharegpt", f"trace.tokenizer={tokenizer_file}", "progress=false",
                        f"hydra.run.dir={out}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    req = pd.read_parquet(out / "requests.parquet")
    assert req["prompt_tokens"].tolist() == [4] and req["output_tokens"].tolist() == [2]
    p = subprocess.run([sys.executable, "-m", "testbed.run", "trace=file", f"trace.path={path}",
                        "trace.format=jsonl", "progress=false", f"hydra.run.dir={tmp_path / 'bad'}"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and "format='jsonl' is not allowed" in p.stderr


def test_a_folder_or_a_missing_file_is_named(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "a.csv").write_text("prompt_tokens,output_tokens\n10,5\n")
    raises([str(tmp_path / "runs"), "is a folder"], tmp_path / "runs")
    raises(["not found", str(tmp_path / "b.csv"), "a.csv"], tmp_path / "b.csv")  # the folder's files listed
