"""The capacity.* keys of `python -m testbed.capacity`: what the search varies and when it stops.
A bad key or value is one line naming it and what is allowed."""
from __future__ import annotations

import datetime
import math
from dataclasses import dataclass, field, fields

PREFIX = "capacity."


class CapacityError(ValueError):
    pass


@dataclass
class CapacitySettings:
    target: float = 0.9  # the SLO attainment a rate must keep (share of all requests meeting every SLO)
    low: float = 0.25  # the lowest rate tried (req/s)
    high: float = 64.0  # the highest rate tried (req/s)
    iterations: int = 8  # bisection steps between them (on log(rate): each halves the bracket's ratio)
    policies: list = field(default_factory=list)  # the policies searched; empty: the composed policy
    out: str = ""  # the output directory; empty: outputs/capacity/<date>/<time to the microsecond>

    def validate(self) -> None:
        if not _number(self.target) or not 0 < self.target <= 1:
            raise CapacityError(f"capacity.target={self.target!r} is invalid; allowed: a share in (0, 1], e.g. 0.9")
        for key in ("low", "high"):
            v = getattr(self, key)
            if not _number(v) or not 0 < v < math.inf:
                raise CapacityError(f"capacity.{key}={v!r} is invalid; allowed: a rate in req/s > 0")
        if not self.low < self.high:
            raise CapacityError(f"capacity.low={self.low:g} is not below capacity.high={self.high:g}")
        if isinstance(self.iterations, bool) or not isinstance(self.iterations, int) or not 0 <= self.iterations <= 40:
            raise CapacityError(f"capacity.iterations={self.iterations!r} is invalid; allowed: an integer in 0..40")
        if not isinstance(self.policies, list) or not all(isinstance(p, str) for p in self.policies):
            raise CapacityError(f"capacity.policies={self.policies!r} is invalid; allowed: a list of policy names, "
                                f"e.g. capacity.policies=[prefill_first,chunked]")
        dup = sorted({p for p in self.policies if self.policies.count(p) > 1})
        if dup:
            raise CapacityError(f"capacity.policies names {dup[0]} twice")

    def out_dir(self, now: datetime.datetime | None = None) -> str:
        now = now or datetime.datetime.now()
        return self.out or f"outputs/capacity/{now:%Y-%m-%d}/{now:%H-%M-%S-%f}"  # searches started together: one each


def _number(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float))


def split_argv(argv: list[str]) -> tuple[CapacitySettings, list[str]]:
    """(the capacity settings, the run overrides) of a command line."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    known = {f.name for f in fields(CapacitySettings)}
    values, overrides = {}, []
    for a in argv:
        if not a.startswith(PREFIX):
            overrides.append(a)
            continue
        try:
            o = OverridesParser.create().parse_override(a)
        except Exception as e:  # Hydra's parse errors are several lines
            raise CapacityError(f"{a}: not an override Hydra can parse ({str(e).splitlines()[0]})") from None
        key = o.key_or_group[len(PREFIX):]
        if key not in known:
            raise CapacityError(f"capacity.{key} is not a setting; the settings: "
                                + ", ".join(f"capacity.{k}" for k in sorted(known)))
        value = o.value()
        if key in ("low", "high", "target") and _number(value):
            value = float(value)
        values[key] = list(value) if key == "policies" and isinstance(value, (list, tuple)) else value
    s = CapacitySettings(**values)
    if isinstance(s.out, (int, float)) and not isinstance(s.out, bool):
        s.out = str(s.out)
    s.validate()
    return s, overrides
