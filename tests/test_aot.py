"""testbed.engine.attention.aot: the module set, its flashinfer names and the install copy.
Nothing here builds a kernel; the comparison with flashinfer's own names is skipped where
flashinfer does not import."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from testbed.engine.attention import aot
from testbed.engine.attention.aot import ModuleSpec

PREFILL_128 = (
    "batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_"
    "head_dim_qk_128_head_dim_vo_128_posenc_0_use_swa_False_use_logits_cap_False_f16qk_False"
)
DECODE_64 = (
    "batch_decode_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_"
    "head_dim_qk_64_head_dim_vo_64_posenc_0_use_swa_False_use_logits_cap_False"
)


def kinds(specs):
    return {(s.kind, s.head_dim) for s in specs}


def test_default_specs_cover_the_models():
    specs = aot.default_specs()
    assert kinds(specs) == {("prefill", 128), ("decode", 128), ("prefill", 64), ("decode", 64)}
    assert len(specs) == len({s.uri for s in specs}) == 4
    assert all(s.backend == "fa2" and s.dtype == "bfloat16" and s.idtype == "int32" for s in specs)
    assert all(s.pos_encoding_mode == 0 and not s.use_sliding_window and not s.use_logits_soft_cap for s in specs)


@pytest.mark.parametrize(
    "shape, expected",
    [
        ((16, 8, 128), {("prefill", 128), ("decode", 128)}),  # Qwen3-0.6B: group 2
        ((32, 8, 128), {("prefill", 128)}),  # Llama-3.1-8B: group 4, tensor-core decode
        ((9, 3, 64), {("prefill", 64), ("decode", 64)}),  # SmolLM2-135M: group 3
    ],
)
def test_modules_for_shape_follows_the_backend_rule(shape, expected):
    assert kinds(aot.modules_for_shape(*shape)) == expected


def test_modules_for_shape_override():
    assert kinds(aot.modules_for_shape(32, 8, 128, decode_use_tensor_cores=False)) == {
        ("prefill", 128), ("decode", 128)}
    assert kinds(aot.modules_for_shape(16, 8, 128, decode_use_tensor_cores=True)) == {("prefill", 128)}


def test_uris():
    assert ModuleSpec("prefill", 128).uri == PREFILL_128
    assert ModuleSpec("decode", 64).uri == DECODE_64
    assert ModuleSpec("prefill", 128, backend="fa3").uri == PREFILL_128 + "_sm90"
    with pytest.raises(ValueError):
        ModuleSpec("mla", 128)
    with pytest.raises(ValueError):
        ModuleSpec("prefill", 128, backend="auto")


def test_gen_args():
    torch = pytest.importorskip("torch")
    bf, i32 = torch.bfloat16, torch.int32
    assert ModuleSpec("decode", 64).gen_args(torch) == (bf, bf, bf, i32, 64, 64, 0, False, False)
    assert ModuleSpec("prefill", 128).gen_args(torch) == (
        "fa2", bf, bf, bf, i32, 128, 128, 0, False, False, False)


def test_select_specs():
    assert [s.uri for s in aot.select_specs(["prefill128"])] == [PREFILL_128]
    assert kinds(aot.select_specs(["decode"])) == {("decode", 64), ("decode", 128)}
    assert len(aot.select_specs(None)) == 4
    with pytest.raises(ValueError):
        aot.select_specs(["nothing-like-this"])


def _flashinfer_modules():
    try:
        from flashinfer.jit.attention import modules
    except Exception as e:  # not installed, or it will not import on this machine
        pytest.skip(f"flashinfer does not import here: {e!r}")
    return modules


def test_uris_match_flashinfer():
    torch = pytest.importorskip("torch")
    fim = _flashinfer_modules()
    for spec in aot.default_specs() + [ModuleSpec("prefill", 128, backend="fa3")]:
        if spec.kind == "prefill":
            assert fim.get_batch_prefill_uri(*spec.gen_args(torch)) == spec.uri
        else:
            assert fim.get_batch_decode_uri(*spec.gen_args(torch)) == spec.uri


# ----------------------------------------------------------------------------- install


def fake_site(tmp_path, version="0.6.18.post1"):
    site = tmp_path / "site"
    (site / "flashinfer" / "data").mkdir(parents=True)
    (site / "flashinfer" / "__init__.py").write_text("")
    if version:
        (site / f"flashinfer_python-{version}.dist-info").mkdir()
    return site


def fake_build(tmp_path, names=("mod_a", "mod_b"), version="0.6.18.post1"):
    out = tmp_path / "fi_aot"
    for name in names:
        (out / name).mkdir(parents=True)
        (out / name / f"{name}.so").write_bytes(b"\x7fELF" + name.encode())
    (out / "not_a_module").mkdir()  # no <name>.so inside: skipped
    (out / "not_a_module" / "x.txt").write_text("x")
    (out / aot.MANIFEST).write_text(json.dumps({"flashinfer_version": version, "arch": "9.0a", "modules": []}))
    return out


def test_install_copies_module_folders(tmp_path):
    site, out = fake_site(tmp_path), fake_build(tmp_path)
    assert aot.built_modules(out) == ["mod_a", "mod_b"]
    done = aot.install(out, site, log=lambda *_: None)
    dest = site / "flashinfer" / "data" / "aot"
    assert sorted(p.name for p in done) == ["mod_a", "mod_b"]
    assert sorted(p.name for p in dest.iterdir()) == ["mod_a", "mod_b"]
    assert (dest / "mod_a" / "mod_a.so").read_bytes() == b"\x7fELFmod_a"
    assert not (dest / aot.MANIFEST).exists()


def test_install_replaces_a_stale_module(tmp_path):
    site, out = fake_site(tmp_path), fake_build(tmp_path)
    stale = site / "flashinfer" / "data" / "aot" / "mod_a"
    stale.mkdir(parents=True)
    (stale / "mod_a.so").write_bytes(b"old")
    (stale / "leftover.o").write_bytes(b"old")
    aot.install(out, site, log=lambda *_: None)
    assert (stale / "mod_a.so").read_bytes() == b"\x7fELFmod_a"
    assert not (stale / "leftover.o").exists()
    aot.install(out, site, log=lambda *_: None)  # again: same result
    assert sorted(p.name for p in stale.iterdir()) == ["mod_a.so"]


def test_install_checks_the_version(tmp_path):
    site, out = fake_site(tmp_path, version="0.7.0"), fake_build(tmp_path)
    with pytest.raises(RuntimeError, match="0.6.18.post1"):
        aot.install(out, site, log=lambda *_: None)
    assert not (site / "flashinfer" / "data" / "aot").exists()
    aot.install(out, site, force=True, log=lambda *_: None)
    assert (site / "flashinfer" / "data" / "aot" / "mod_b" / "mod_b.so").is_file()


def test_install_without_manifest_or_dist_info(tmp_path):
    site, out = fake_site(tmp_path, version=None), fake_build(tmp_path, names=("m",))
    (out / aot.MANIFEST).unlink()
    aot.install(out, site, log=lambda *_: None)
    assert (site / "flashinfer" / "data" / "aot" / "m" / "m.so").is_file()


def test_install_errors(tmp_path):
    out = fake_build(tmp_path)
    with pytest.raises(FileNotFoundError, match="no flashinfer"):
        aot.install(out, tmp_path / "empty_site", log=lambda *_: None)
    with pytest.raises(FileNotFoundError, match="no built modules"):
        aot.install(tmp_path / "nothing", fake_site(tmp_path), log=lambda *_: None)


def test_cli_install_and_list(tmp_path, capsys):
    site, out = fake_site(tmp_path), fake_build(tmp_path)
    assert aot.main(["install", "--aot", str(out), "--site", str(site)]) == 0
    assert "installed 2 flashinfer modules" in capsys.readouterr().out
    assert aot.main(["list"]) == 0
    listed = capsys.readouterr().out
    assert PREFILL_128 in listed and DECODE_64 in listed


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_libcuda_stub(tmp_path):
    lib = aot.make_libcuda_stub(tmp_path / "stub")
    assert lib.is_file() and (tmp_path / "stub" / "libcuda.so.1").exists()
    if shutil.which("readelf"):
        dyn = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
        assert "libcuda.so.1" in dyn  # soname: what the built modules will ask for
    assert aot.make_libcuda_stub(tmp_path / "stub") == lib  # idempotent


def test_install_errors_on_the_command_line_are_one_line(tmp_path, capsys):
    site = fake_site(tmp_path, version="0.7.0")
    out = fake_build(tmp_path)
    for args, needle in ((["--aot", str(tmp_path / "nothing"), "--site", str(site)], "error: no built modules"),
                         (["--aot", str(out), "--site", str(tmp_path / "empty_site")], "error: no flashinfer package"),
                         (["--aot", str(out), "--site", str(site)], "error: modules in")):
        assert aot.main(["install", *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(needle), err
