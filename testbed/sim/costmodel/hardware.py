"""Accelerator ceilings the analytic cost model divides by (conf/hardware/<name>.yaml).

The figures are the hardware's; how much of them a kernel reaches (efficiency factors)
belongs to the cost model's config, not here.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

__all__ = ["HardwareSpec", "load_hardware", "available_hardware", "CONF_HARDWARE_DIR"]


def to_plain(x: Any) -> Any:
    """An OmegaConf container as plain dicts / lists (resolved); anything else unchanged."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf comes with hydra-core
        return x
    if isinstance(x, (DictConfig, ListConfig)):
        return OmegaConf.to_container(x, resolve=True)
    return x

#: conf/hardware/ of this checkout; names given to ``load_hardware`` are looked up here.
CONF_HARDWARE_DIR = Path(__file__).resolve().parents[3] / "conf" / "hardware"


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator.

    name: label. mem_bw: memory bandwidth (B/s). flops: dense bf16 matmul FLOP/s.
    mem_bytes: device memory (B). link_bw: GPU-to-GPU interconnect bandwidth per direction
    per GPU (B/s). link_latency_s: fixed cost of one collective (s). num_sms: streaming
    multiprocessors (the calibrated model emulates the attention kernel's work split over
    them; 0: unknown).
    """

    name: str
    mem_bw: float
    flops: float
    mem_bytes: float
    link_bw: float
    link_latency_s: float = 1e-5
    num_sms: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.num_sms, bool) or not isinstance(self.num_sms, int) or self.num_sms < 0:
            raise ValueError(f"hardware.num_sms={self.num_sms!r} is invalid ({self.name}); allowed: an integer >= 0")
        for f in ("mem_bw", "flops", "mem_bytes", "link_bw", "link_latency_s"):
            v = getattr(self, f)
            try:
                fv = float(v)
            except (TypeError, ValueError):
                fv = float("nan")
            ok = math.isfinite(fv) and (fv >= 0 if f == "link_latency_s" else fv > 0)
            if not ok or isinstance(v, bool):
                allowed = ">= 0" if f == "link_latency_s" else "> 0"
                raise ValueError(
                    f"hardware.{f}={v!r} is invalid ({self.name}); allowed: a number {allowed}"
                )
            object.__setattr__(self, f, fv)


def available_hardware() -> list[str]:
    """Names of conf/hardware/*.yaml."""
    if not CONF_HARDWARE_DIR.is_dir():
        return []
    return sorted(p.stem for p in CONF_HARDWARE_DIR.glob("*.yaml"))


def _from_mapping(d: Mapping[str, Any], where: str) -> HardwareSpec:
    allowed = [f.name for f in dataclasses.fields(HardwareSpec)]
    unknown = sorted(set(d) - set(allowed))
    if unknown:
        raise ValueError(f"hardware ({where}): unknown key(s) {unknown}; allowed: {allowed}")
    missing = [f.name for f in dataclasses.fields(HardwareSpec)
               if f.default is dataclasses.MISSING and f.name not in d]
    if missing:
        raise ValueError(f"hardware ({where}): missing key(s) {missing}")
    return HardwareSpec(**dict(d))


def load_hardware(hw: HardwareSpec | str | os.PathLike | Mapping[str, Any]) -> HardwareSpec:
    """A ``HardwareSpec`` from itself, a name (conf/hardware/<name>.yaml), a yaml path, or a
    mapping / DictConfig with the fields."""
    if isinstance(hw, HardwareSpec):
        return hw
    if isinstance(hw, (str, os.PathLike)):
        s = os.fspath(hw)
        p = Path(s)
        if p.suffix not in (".yaml", ".yml"):
            p = CONF_HARDWARE_DIR / f"{s}.yaml"
            if not p.is_file():
                raise ValueError(
                    f"hardware={s!r} is unknown; allowed: {available_hardware()} "
                    "or a path to a .yaml"
                )
        from omegaconf import OmegaConf

        return _from_mapping(OmegaConf.to_container(OmegaConf.load(p), resolve=True), str(p))
    hw = to_plain(hw)
    if isinstance(hw, Mapping):
        return _from_mapping(hw, str(hw.get("name", "<mapping>")))
    raise TypeError(f"hardware: cannot build a HardwareSpec from {type(hw).__name__}")
