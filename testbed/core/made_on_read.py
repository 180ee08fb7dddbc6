"""A sequence whose items are made when first read and kept: a trace's rows and a replay's
requests, read as each request arrives rather than all before the first step."""
from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence


class MadeOnRead(Sequence):
    """n items; item i is `_make(i)` (i >= 0), made on its first read and the same object after."""

    def __init__(self, n: int):
        self._made: list = [None] * n

    @abstractmethod
    def _make(self, i: int):
        """Item i (0 <= i < n)."""

    def __len__(self) -> int:
        return len(self._made)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        x = self._made[i]  # IndexError beyond the ends, as a list's
        if x is None:
            x = self._made[i] = self._make(i if i >= 0 else i + len(self._made))
        return x

    def made(self) -> list:
        """The items read so far, in order."""
        return [x for x in self._made if x is not None]
