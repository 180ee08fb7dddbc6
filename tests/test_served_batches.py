"""The step profiler's served batches: mixed batches as the policies serve them, from the
simulator (testbed/fidelity/served_batches.py), kept as the profile's `batch` samples, priced by
the local correction only."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from testbed.sim.costmodel.fit import Fa2Shape, fit_eager, local_features, pool_device_samples, sample_batch

REPO = Path(__file__).resolve().parents[1]
FA = Fa2Shape(group=2, kv_heads=8, num_sms=132, page_size=1)
PROFILE = REPO / "testbed/sim/costmodel/profiles/h200_qwen3_0_6b.json"


def mixed(decodes, chunk, ctx, pre=0):
    return np.array([chunk] + [1] * decodes), np.array([pre] + list(ctx))


def test_pick_spreads_over_the_plan_groups_and_within_them():
    from testbed.fidelity.served_batches import pick
    rng = np.random.default_rng(0)
    common = [mixed(60, 450, rng.integers(100, 3000, 60)) for _ in range(400)]  # one group, many
    rare = [mixed(16, 496, rng.integers(5000, 27000, 16), 4000) for _ in range(9)]  # another, few
    batches = common + rare
    got = pick(batches, 20, FA)
    groups = Counter(local_features(e, c, FA)[0] for e, c in got)
    # shares by the square root of the counts: 20 x 3 / 23 = 3 of the 9 rare ones (by their
    # count alone: 0.4), 17 of the 400
    assert groups[local_features(*rare[0], FA)[0]] == 3 and groups[local_features(*common[0], FA)[0]] == 17
    rows = lambda bs: [(e.tolist(), c.tolist()) for e, c in bs]  # noqa: E731
    assert rows(pick(batches, 20, FA)) == rows(got)  # deterministic
    # within a group the picks are apart: no two at one place
    common_group = local_features(*common[0], FA)[0]
    places = np.array([x for g, x in (local_features(e, c, FA) for e, c in got) if g == common_group])
    d = np.sqrt(((places[:, None] - places[None]) ** 2).sum(-1)) + np.eye(len(places)) * 9
    assert d.min() > 0
    assert pick(batches, 0, FA) == [] and pick([], 5, FA) == []


def test_a_served_batch_is_stored_row_for_row_and_kept_out_of_the_eager_fit():
    torch = pytest.importorskip("torch")  # noqa: F841 (the profiler module imports it)
    from testbed.engine.profiler import device_grid, shape_record
    e, c = mixed(5, 300, [700, 900, 40, 3000, 12])
    grid = device_grid(2048, 64, [1, 2, 4, 8], 1 << 20, quick=True, batches=[(e, c), mixed(100, 300, [10] * 100)])
    served = [sh for sh in grid if sh.pattern == "batch"]
    assert len(served) == 1  # the one of 101 rows is beyond max_running=64
    rec = shape_record(served[0])
    assert rec["kind"] == "mixed" and rec["reqs"] == 6 and rec["tokens"] == 305
    assert sample_batch(rec) == (e.tolist(), c.tolist())
    # the eager fit is the same with served batches among its samples: they price through the
    # local correction only
    samples = [d for d in json.loads(PROFILE.read_text())["samples"]["device"]]
    fa = Fa2Shape(**json.loads(PROFILE.read_text())["device"]["eager"]["fa2"])
    extra = [rec | {"device_s": 0.5, "prep_s": 0.0, "launch_s": 0.0, "free_s": 0.5}]
    base = fit_eager(samples, 256, [], fa)
    assert fit_eager(samples + extra, 256, [], fa) == base
    # pooled across starts per batch: two batches of one summary stay apart
    other = rec | {"cached_lens": [0, 701, 899, 40, 3000, 12], "device_s": 1.0}
    pooled = pool_device_samples([[rec | {"device_s": 2.0}, other], [rec | {"device_s": 4.0}]])
    assert sorted(p["device_s"] for p in pooled) == [1.0, 3.0]


@pytest.mark.slow
@pytest.mark.parametrize("hardware", ["h200", "a100"])  # a100: no profile, the roofline (no host time)
def test_the_simulator_serves_mixed_batches_of_both_chunking_policies(hardware):
    from testbed.fidelity.served_batches import simulated_batches
    got = simulated_batches(["model=qwen3_0_6b", f"hardware={hardware}"], ("chunked", "decode_first"), requests=60)
    assert len(got) > 50
    for e, c in got:
        assert (e >= 1).all() and (c >= 0).all() and (e == 1).any() and (e > 1).any()
        assert int(e.sum()) <= 8192  # within the step budget


def test_the_profiler_rejects_a_bad_served_count_in_one_line():
    p = subprocess.run([sys.executable, "-m", "testbed.profile", "served=some"], cwd=REPO, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 2 and p.stderr.strip() == "error: served=some is invalid; allowed: an integer >= 0"


def test_refit_takes_served_batches_timed_on_their_own_as_local_shapes(tmp_path):
    """benchmarks/measure_served_batches.py's file (records and samples, no fits) joins a
    profile's local shapes; a file that is neither is a one-line error naming it."""
    prof = json.loads(PROFILE.read_text())
    e, c = mixed(16, 496, [12000] * 16, 3000)
    rec = {"kind": "mixed", "pattern": "batch", "reqs": 17, "tokens": int(e.sum()), "kv_tokens": int((e + c).sum()),
           "extend": 496, "cached": 12000, "chunk_cached": 3000, "extend_lens": e.tolist(), "cached_lens": c.tolist(),
           "prep_s": 1e-4, "launch_s": 1e-3, "free_s": 0.02, "device_s": 0.02}
    machine = dict(prof["machine"], date="2026-12-05T00:00:00Z")
    served = tmp_path / "served.json"
    served.write_text(json.dumps({"model": prof["model"], "hardware": prof["hardware"], "engine": prof["engine"],
                                  "machine": machine, "samples": {"device": [rec]}}))
    out = tmp_path / "p.json"
    p = subprocess.run([sys.executable, "-m", "testbed.profile", f"refit={PROFILE}", f"local_from={served}",
                        f"out={out}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    new = json.loads(out.read_text())
    assert new["samples"]["local"][-1] == rec | {"start": "served"}
    assert new["local_machines"][-1]["date"] == "2026-12-05T00:00:00Z"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model": prof["model"], "samples": {"device": []}}))
    p = subprocess.run([sys.executable, "-m", "testbed.profile", f"refit={PROFILE}", f"local_from={bad}",
                        f"out={out}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stderr.strip() == (
        f"error: local_from={bad}: not a profile or served batches' file (missing engine, machine)")


def test_decode_batches_are_picked_per_graph_size():
    from testbed.fidelity.served_batches import pick_decodes
    rng = np.random.default_rng(1)
    dec = lambda b: (np.ones(b, np.int64), rng.integers(100, 4000, b))  # noqa: E731
    batches = [dec(40) for _ in range(100)] + [dec(150) for _ in range(4)] + [dec(300) for _ in range(2)]
    got = pick_decodes(batches, 12, [32, 48, 64, 160, 256])
    rows = Counter(len(e) for e, _ in got)
    # the 48-row graph's many, the 160-row graph's and the eager batches' few, each a share
    assert set(rows) == {40, 150, 300} and rows[40] > rows[150] >= 1 and rows[300] >= 1


@pytest.mark.slow
def test_served_batches_are_timed_on_the_engine_into_a_file_refit_takes(tmp_path):
    """benchmarks/measure_served_batches.py time, on the CPU reference engine: each batch timed
    as the profiler times a shape (its rows as given), the records and machine written, and the
    file one that refit's local_from= reads."""
    pytest.importorskip("torch")
    from testbed.profile import local_source
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps({"model": {"name": "smollm2_135m"}, "hardware": {"name": "h200"},
                                "engine": {"graph_sizes": []}}))
    batches = [{"kind": "mixed", "extend": [1, 1, 30], "cached": [40, 57, 0]},
               {"kind": "decode", "extend": [1, 1], "cached": [20, 31], "label": "two rows"}]
    (tmp_path / "b.json").write_text(json.dumps({"batches": batches}))
    out = tmp_path / "timed.json"
    p = subprocess.run([sys.executable, "benchmarks/measure_served_batches.py", "time", "--profile", str(prof),
                        "--batches", str(tmp_path / "b.json"), "--out", str(out), "--repeats", "1",
                        *(a for o in ("engine.device=cpu", "engine.attention=torch", "engine.num_pages=4096",
                                      "scheduler.max_running=8") for a in ("--set", o))],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    got = local_source(out)
    assert got["machine"]["cpu_count"] >= 1 and got["model"] == {"name": "smollm2_135m"}
    samples = got["samples"]["device"]
    assert [(d["kind"], d["pattern"], d["extend_lens"], d["cached_lens"]) for d in samples] == [
        (b["kind"], "batch", b["extend"], b["cached"]) for b in batches]
    assert all(d["device_s"] > 0 and d["prep_s"] > 0 for d in samples)
    assert [d.get("label") for d in samples] == [None, "two rows"]  # an experiment's names kept
