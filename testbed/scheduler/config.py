"""The scheduler's settings: the KV pool, the context limit and the prefix cache."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SchedulerConfig:
    num_pages: int = 65536
    page_size: int = 1
    max_context: int = 131072  # longest sequence (prompt + output) the model takes
    cache: str = "radix"  # radix | none
    eviction: str = "lru"
    check_every_step: bool = False  # run the KV integrity check after every step (tests, debugging)

    def validate(self) -> None:
        for key in ("num_pages", "page_size", "max_context"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)!r} is invalid; allowed: an integer >= 1")
