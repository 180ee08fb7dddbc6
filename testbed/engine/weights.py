"""Weights into a model: streamed from a HF safetensors dir, or generated ("dummy").

A model exposes ``weight_map()``: HF tensor name -> (module, shard id, full HF shape); each
module's ``load(shard_id, reader)`` takes the slice its tensor-parallel rank keeps through
the reader, so a checkpoint is read one tensor (and one shard of it) at a time.

Checks happen on the safetensors headers before any data is read: a missing tensor or a
shape mismatch fails at once, naming the tensor and the dir; extra tensors are reported
(and warned about) but not fatal.
"""

from __future__ import annotations

import json
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from testbed.modelspec import UnsupportedArchitectureError, load_model_spec

__all__ = [
    "load_weights",
    "LoadReport",
    "WeightLoadError",
    "MissingWeightError",
    "WeightShapeError",
    "UnsupportedArchitectureError",
    "checkpoint_files",
]

INDEX_FILE = "model.safetensors.index.json"
_SILENTLY_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


class WeightLoadError(ValueError):
    pass


class MissingWeightError(WeightLoadError):
    pass


class WeightShapeError(WeightLoadError):
    pass


@dataclass
class LoadReport:
    source: str
    loaded: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)  # in the checkpoint, not used by the model
    files: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        extra = f", {len(self.unexpected)} unexpected" if self.unexpected else ""
        return f"loaded {len(self.loaded)} tensors from {self.source}{extra}"


def load_weights(
    model: Any, source: str | Path, *, seed: int = 0, dummy_std: float = 0.02
) -> LoadReport:
    """Fill ``model`` from a safetensors dir, or with seeded random weights if ``source == "dummy"``."""
    if str(source) == "dummy":
        return _load_dummy(model, seed, dummy_std)
    return _load_dir(model, Path(source))


# --- safetensors dir --------------------------------------------------------------------


class _SliceReader:
    """A safetensors slice: the shape from the header, data read on demand, one slice at a time."""

    def __init__(self, sl) -> None:
        self._sl = sl
        self.shape = tuple(sl.get_shape())

    def read(self, dim: int | None = None, start: int = 0, end: int | None = None) -> torch.Tensor:
        if dim is None:
            return self._sl[:]
        index = [slice(None)] * len(self.shape)
        index[dim] = slice(start, end)
        return self._sl[tuple(index)]


def checkpoint_files(path: Path) -> list[Path]:
    """The safetensors files of a model dir (from the index when sharded)."""
    index = path / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({path / f for f in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise WeightLoadError(f"{index} lists files that are not in {path}: {missing}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise WeightLoadError(f"no *.safetensors files (and no {INDEX_FILE}) in {path}")
    return files


def _check_architecture(model: Any, path: Path) -> None:
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        return  # weights without a config: trust the caller's model
    arch = load_model_spec(cfg_path).architecture  # an unsupported one raises, naming the file
    if arch != model.config.architecture:
        raise UnsupportedArchitectureError(
            f"{path} holds a {arch} checkpoint, the model is a {model.config.architecture}"
        )


def _open(f: Path):
    """safe_open of one checkpoint file; a file that is not a whole safetensors file (cut
    short, not safetensors) is a WeightLoadError naming it."""
    from safetensors import SafetensorError, safe_open
    try:
        return safe_open(f, framework="pt", device="cpu")
    except (SafetensorError, OSError) as e:
        raise WeightLoadError(f"{f}: not a readable safetensors file ({e})") from None


def _load_dir(model: Any, path: Path) -> LoadReport:

    if not path.is_dir():
        raise WeightLoadError(f"weights path {path} is not a directory (or 'dummy')")
    _check_architecture(model, path)
    targets = model.weight_map()
    ignored = set(model.ignored_checkpoint_names())
    files = checkpoint_files(path)
    report = LoadReport(source=str(path), files=[f.name for f in files])

    # Pass 1, headers only: every tensor present, every shape right, before reading data.
    where: dict[str, Path] = {}
    for f in files:
        with _open(f) as st:
            for name in st.keys():
                if name not in targets:
                    if name not in ignored and not name.endswith(_SILENTLY_IGNORED_SUFFIXES):
                        report.unexpected.append(name)
                    continue
                got = tuple(st.get_slice(name).get_shape())
                want = tuple(targets[name][2])
                if got != want:
                    raise WeightShapeError(
                        f"{name}: expected shape {want}, got {got} (in {f})"
                    )
                where[name] = f
    missing = [n for n in targets if n not in where]
    if missing:
        shown = ", ".join(missing[:8]) + (f" ... ({len(missing)} in all)" if len(missing) > 8 else "")
        raise MissingWeightError(f"tensor(s) missing from {path}: {shown}")

    # Pass 2: stream, one tensor (slice) at a time.
    for f in files:
        with _open(f) as st:
            for name in st.keys():
                if where.get(name) != f:
                    continue
                module, shard, _ = targets[name]
                module.load(shard, _SliceReader(st.get_slice(name)))
                report.loaded.append(name)
    if report.unexpected:
        warnings.warn(
            f"{len(report.unexpected)} tensor(s) in {path} are not used by the model: "
            f"{report.unexpected[:8]}",
            stacklevel=2,
        )
    return report


# --- dummy ------------------------------------------------------------------------------


class _GeneratedReader:
    """A full-shape tensor generated on the target device (so TP ranks agree), then sliced."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self._t = tensor
        self.shape = tuple(tensor.shape)

    def read(self, dim: int | None = None, start: int = 0, end: int | None = None) -> torch.Tensor:
        if dim is None:
            return self._t
        end = self.shape[dim] if end is None else end
        return self._t.narrow(dim, start, end - start)


def _load_dummy(model: Any, seed: int, std: float) -> LoadReport:
    device, dtype = model.device, model.dtype
    report = LoadReport(source="dummy")
    for name, (module, shard, shape) in model.weight_map().items():
        if name.endswith("norm.weight"):
            t = torch.ones(shape, dtype=dtype, device=device)
        else:
            gen = torch.Generator(device=device)
            gen.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
            t = torch.empty(shape, dtype=dtype, device=device).normal_(0.0, std, generator=gen)
        module.load(shard, _GeneratedReader(t))
        report.loaded.append(name)
        del t
    return report
