"""`python -m testbed.engine.convert gguf F`: a file that is not a GGUF, or a GGUF cut short, is
one line naming the file (the reader's traceback before), and nothing is written."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
from testbed.engine.convert import main  # noqa: E402


def test_not_a_gguf_file(tmp_path, capsys):
    f = tmp_path / "config.json"
    f.write_text('{"architectures": ["LlamaForCausalLM"]}')
    assert main(["gguf", str(f), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: {f} is not a GGUF file (it does not start with the bytes 'GGUF')")
    assert not (tmp_path / "out").exists()


def test_a_gguf_cut_short(tmp_path, capsys):
    f = tmp_path / "cut.gguf"
    f.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (7).to_bytes(8, "little"))  # a header, then nothing
    assert main(["gguf", str(f), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"error: transformers could not read {f}: ")
    assert not (tmp_path / "out").exists()
