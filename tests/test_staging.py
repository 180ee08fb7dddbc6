"""The pinned staging of a step's host arrays (testbed/engine/staging.py), on the CPU: the
packing by dtype, the views' shapes and contents, and the slots taken in turn (on CUDA the same
code adds pinned memory, asynchronous copies and an event per slot)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from testbed.engine.staging import PinnedUploader  # noqa: E402


def test_upload_keeps_contents_shapes_and_dtypes():
    up = PinnedUploader("cpu", slots=2)
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 1 << 40, 7), np.arange(5, dtype=np.int32), np.zeros(0, np.int64),
              rng.integers(0, 100, (3, 4)).astype(np.int32), np.array([2.5, -1.0], np.float32)]
    out = up.upload(arrays)
    for a, t in zip(arrays, out):
        assert t.dtype == torch.from_numpy(a).dtype and tuple(t.shape) == a.shape
        assert np.array_equal(t.numpy(), a)


def test_slots_are_used_in_turn_and_grow():
    up = PinnedUploader("cpu", slots=2)
    a = up.upload([np.arange(10)])[0]
    b = up.upload([np.arange(10) + 100])[0]
    assert np.array_equal(a.numpy(), np.arange(10))  # the second upload went to the other slot
    big = np.arange(5000)
    c = up.upload([big])[0]  # slot 0 again, grown past its first capacity
    assert np.array_equal(c.numpy(), big) and np.array_equal(b.numpy(), np.arange(10) + 100)
    up.release(None)  # no events on the CPU
