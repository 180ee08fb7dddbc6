"""testbed.core.registry: the one way every pluggable part is found by name."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testbed.core.registry import Registry, read_config

REPO = Path(__file__).resolve().parents[1]


def test_register_get_names_and_the_one_line_error():
    r = Registry("thing.name")
    r.register("b", int)

    @r.register("a", config=dict)
    def make_a():
        return "a"
    assert r.names() == ["a", "b"]
    assert r.get("a").obj is make_a and r.get("a").config is dict and r.get("b").obj is int
    with pytest.raises(ValueError, match=r"^thing.name='c' is unknown; allowed: a, b$"):
        r.get("c")
    with pytest.raises(ValueError, match=r"allowed: a, auto, b$"):
        r.check("c", also=("auto",))
    r.check("auto", also=("auto",))
    with pytest.raises(ValueError, match="registered twice"):
        r.register("b", float)


def test_owning_modules_are_imported_only_on_lookup(tmp_path, monkeypatch):
    (tmp_path / "reg_owner.py").write_text("import reg_home\nreg_home.R.register('x', 42)\n")
    (tmp_path / "reg_silent.py").write_text("")
    (tmp_path / "reg_home.py").write_text(
        "from testbed.core.registry import Registry\n"
        "R = Registry('part.name', modules={'x': 'reg_owner', 'y': 'reg_silent'})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import reg_home
    assert reg_home.R.names() == ["x", "y"]
    reg_home.R.check("x")
    assert "reg_owner" not in sys.modules
    assert reg_home.R.get("x").obj == 42 and "reg_owner" in sys.modules
    with pytest.raises(TypeError, match="reg_silent was to register part.name='y'"):
        reg_home.R.get("y")


def test_a_package_registry_names_its_modules(tmp_path, monkeypatch):
    pkg = tmp_path / "reg_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "one.py").write_text("VALUE = 1\n")
    (pkg / "_private.py").write_text("VALUE = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    r = Registry("pkg.name", package="reg_pkg", pick=lambda m: m.VALUE)
    assert r.names() == ["one"]
    assert r.get("one").obj == 1
    with pytest.raises(ValueError, match="allowed: one$"):
        r.get("_private")


def test_read_config():
    from dataclasses import dataclass

    @dataclass
    class C:
        a: int = 1
    assert read_config(C, None, "x") == C() and read_config(C, {"name": "n", "a": 3}, "x") == C(3)
    with pytest.raises(ValueError, match=r"^x: unknown key\(s\) \['b'\]; allowed: \['a'\]$"):
        read_config(C, {"b": 2}, "x")


def test_a_simulator_config_check_imports_no_torch():
    """The engine's names (engine.attention, engine.kernels) are checked without torch."""
    code = ("import sys; from testbed.config import compose; import testbed.run; "
            "compose(['engine.attention=torch', 'engine.kernels=triton']); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
