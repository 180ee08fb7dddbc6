"""The detokenizer's text (testbed/serve/detokenize.py): a character split over byte tokens
is held back until it is whole, a partial stop string until it is decided, and the text
streamed equals the text decoded at once."""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from engine_fixtures import save_byte_tokenizer  # noqa: E402
from testbed.serve.detokenize import REPLACEMENT, IncrementalText, StopStrings  # noqa: E402

TEXT = "héllo 😀 世界, naïve café ✓"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer
    d = tmp_path_factory.mktemp("bytetok")
    save_byte_tokenizer(d)
    return AutoTokenizer.from_pretrained(d)


def test_multibyte_characters_are_never_split(tok):
    ids = tok(TEXT)["input_ids"]
    assert len(ids) == len(TEXT.encode())  # one token per byte: the emoji is 4 tokens
    inc = IncrementalText(tok)
    deltas = [inc.add([i]) for i in ids]
    assert all(REPLACEMENT not in d for d in deltas)
    assert "".join(deltas) + inc.flush() == TEXT
    # the emoji's first three bytes give nothing; its fourth gives it whole
    k = len("héllo ".encode())
    assert deltas[k:k + 3] == ["", "", ""] and deltas[k + 3] == "😀"


def test_an_incomplete_character_at_the_end_is_flushed(tok):
    ids = tok("a😀")["input_ids"][:-1]  # the emoji cut short
    inc = IncrementalText(tok)
    assert "".join(inc.add([i]) for i in ids) == "a"
    assert inc.flush() == tok.decode(ids[1:])  # what is there, replacement character and all


def test_special_tokens_are_skipped(tok):
    inc = IncrementalText(tok)
    assert inc.add(tok("ok")["input_ids"] + [2]) + inc.flush() == "ok"


def stream(stops, pieces):
    s = StopStrings(stops)
    out, stopped = [], False
    for p in pieces:
        text, stopped = s.add(p)
        out.append(text)
        if stopped:
            break
    return out, stopped, s


def test_a_stop_string_split_over_deltas_ends_the_text_before_it():
    out, stopped, _ = stream(["STOP"], ["abc S", "T", "OP and more"])
    assert stopped and "".join(out) == "abc "
    assert out[0] == "abc " and out[1] == ""  # "S" and "ST" held back


def test_a_false_start_is_let_through_once_decided():
    out, stopped, s = stream(["STOP"], ["a ST", "ay"])
    assert not stopped and out == ["a ", "STay"]
    out, stopped, s = stream(["STOP"], ["end S"])
    assert out == ["end "] and s.flush() == "S"


def test_the_earliest_of_several_stop_strings_wins():
    out, stopped, _ = stream(["\n\n", "x"], ["one x two\n\nthree"])
    assert stopped and out == ["one "]


def test_no_stop_strings_holds_nothing():
    out, stopped, _ = stream([], ["a", "b"])
    assert out == ["a", "b"] and not stopped


def test_a_steps_first_tokens_go_out_ahead_of_the_rest(tok):
    from testbed.serve.detokenizer_worker import Detokenizer
    from testbed.serve.messages import DetokenizeReq, TokenOut
    d = Detokenizer(tok, to_scheduler=None)
    for rid in range(4):
        d.register(DetokenizeReq(rid, 3, ()))
    a, b = tok("a")["input_ids"], tok("b")["input_ids"]
    assert [[o.rid for o in m] for m in d.batch([TokenOut(0, a), TokenOut(1, a)])] == [[0, 1]]  # all first: one message
    # requests 0 and 1 are streaming; 2 and 3 get their first tokens in this step, 3 only half a character
    half = tok("😀")["input_ids"][:1]
    msgs = d.batch([TokenOut(0, b), TokenOut(2, a), TokenOut(1, b, "length"), TokenOut(3, half)])
    assert [[(o.rid, o.text, o.finish_reason) for o in m] for m in msgs] == [[(2, "a", None)],
                                                                          [(0, "b", None), (1, "b", "length")]]
    assert [[o.text for o in m] for m in d.batch([TokenOut(3, tok("😀")["input_ids"][1:])])] == [["😀"]]
