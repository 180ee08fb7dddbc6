"""benchmarks/runs_as_samples.py (an engine run set's served steps as measured samples) and
`python -m testbed.profile refit=P graph_samples_from=F`, which fits a profile's decode graphs
on them too."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
PROFILE = REPO / "testbed/sim/costmodel/profiles/h200_qwen3_0_6b.json"
START6 = REPO / "benchmarks/results/fidelity/missing_cells_start6"


def step(size, kv, longest, per_kv):
    return {"kind": "decode", "reqs": size - 3, "kv_tokens": kv, "device_s": per_kv * kv, "_size": size,
            "_longest": longest}


def test_thin_keeps_each_stratums_share_and_its_median_member():
    import runs_as_samples as r
    steps = [step(160, kv, 1.5, 1e-8 * (1.0 + kv / 1e6)) for kv in range(100_000, 100_090)]  # 90 under 2x
    steps += [step(160, kv, 3.5, 1e-8 * (0.9 + kv / 1e6)) for kv in range(200_000, 200_030)]  # 30 at 3-4x
    steps += [step(176, 300_000, 2.5, 0.97)]
    got = r.thin(steps, per_size=8)
    at160 = [g for g in got if g["reqs"] == 157]
    assert len(at160) == 8 and len([g for g in got if g["reqs"] == 173]) == 1
    # 6 of the 8 from the 90 short-tailed steps, 2 from the 30 long-tailed, each a KV slice's middle
    assert sorted(g["kv_tokens"] for g in at160) == [100_007, 100_022, 100_037, 100_052, 100_067, 100_082,
                                                     200_007, 200_022]
    assert not any(k.startswith("_") for g in got for k in g)


@pytest.mark.slow
def test_the_committed_served_graphs_are_what_the_script_writes(tmp_path):
    """missing_cells_start6/served_graphs.json, the decode-graph steps the Qwen3-0.6B profile's
    graph fit holds, comes back from that run set's files."""
    out = tmp_path / "g.json"
    p = subprocess.run([sys.executable, "benchmarks/runs_as_samples.py", "--dir", str(START6), "--profile",
                        str(PROFILE), "--min-rows", "145", "--kinds", "graph", "--out", str(out)],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    got, committed = json.loads(out.read_text()), json.loads((START6 / "served_graphs.json").read_text())
    assert got["samples"] == committed["samples"] and got["machine"] == committed["machine"]
    assert {d["kind"] for d in got["samples"]["device"]} == {"decode"}
    assert min(d["reqs"] for d in got["samples"]["device"]) >= 145


def test_refit_fits_the_graphs_on_served_steps_too(tmp_path):
    """graph_samples_from= adds a file's decode-graph steps to the graph fit at their sizes (named by
    the file), records the start they ran on, and takes a file once; a file without such steps, or
    of another model, is a one-line error."""
    prof = json.loads(PROFILE.read_text())
    base = tmp_path / "base.json"
    p = subprocess.run([sys.executable, "-m", "testbed.profile", f"refit={PROFILE}", f"out={base}"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    own = [d for d in json.loads(base.read_text())["samples"]["device"] if d.get("start") != "served_graphs"]
    served = json.loads((START6 / "served_graphs.json").read_text())
    slow = [d | {"device_s": d["device_s"] * 1.5} for d in served["samples"]["device"]]  # 1.5x slower steps
    f = tmp_path / "slow.json"
    f.write_text(json.dumps(served | {"samples": {"device": slow}}))
    base_prof = json.loads(base.read_text())
    base_prof["samples"]["device"] = own  # the grid alone
    base_prof.pop("graph_sample_machines", None)
    base.write_text(json.dumps(base_prof))
    out = tmp_path / "p.json"
    p = subprocess.run([sys.executable, "-m", "testbed.profile", f"refit={base}", f"graph_samples_from={f},{f}",
                        f"out={out}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    new = json.loads(out.read_text())
    kept = [d for d in new["samples"]["device"] if d.get("start") == "slow"]  # device_s rounded as the fit stores it
    assert [{k: v for k, v in d.items() if k != "device_s"} for d in kept] == [
        {k: v for k, v in d.items() if k != "device_s"} | {"start": "slow"} for d in slow]
    assert [d["device_s"] for d in kept] == pytest.approx([d["device_s"] for d in slow], abs=1e-7)  # to 0.1 us
    assert [m["date"] for m in new["graph_sample_machines"]] == [served["machine"]["date"]]
    g0, g1 = base_prof["device"]["graph"], new["device"]["graph"]
    i160, i64 = g0["sizes"].index(160), g0["sizes"].index(64)
    price = lambda g, i: g["const_s"][i] + g["per_kv_token_s"][i] * 300_000  # noqa: E731
    assert price(g1, i160) > 1.05 * price(g0, i160)  # the slow steps pulled the 160-row graph's fit up
    assert g1["const_s"][i64] == g0["const_s"][i64]  # no served step of 64 rows: as fitted before
    bad = tmp_path / "mixed_only.json"
    bad.write_text(json.dumps(served | {"samples": {"device": [d | {"kind": "mixed"} for d in slow[:2]]}}))
    p = subprocess.run([sys.executable, "-m", "testbed.profile", f"refit={base}", f"graph_samples_from={bad}",
                        f"out={out}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stderr.strip() == f"error: graph_samples_from={bad}: no CUDA-graph decode samples"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(served | {"model": dict(prof["model"], name="llama3_8b")}))
    p = subprocess.run([sys.executable, "-m", "testbed.profile", f"refit={base}", f"graph_samples_from={other}",
                        f"out={out}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "another model or engine settings" in p.stderr and p.stderr.count("\n") == 1
