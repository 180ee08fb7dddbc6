"""benchmarks/exp_unsplit_decode.py: the batches it lays out, and the report that prices the timed ones."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))


def test_the_batches_hold_their_long_rows_and_padding(tmp_path):
    import exp_unsplit_decode as x
    out = tmp_path / "b.json"
    x.make(out)
    got = json.loads(out.read_text())["batches"]
    assert len(got) == len(x.SIZES) * len(x.MEANS) * len(x.PAD) * len(x.LONG)
    by = {b["label"]: b for b in got}
    for size in x.SIZES:
        for mean in x.MEANS:
            for pad in x.PAD:
                for name, n_long, factor in x.LONG:
                    b = by[f"{size}/{mean}/pad{pad}/{name}"]
                    ctx = np.add(b["extend"], b["cached"])
                    assert b["kind"] == "decode" and set(b["extend"]) == {1} and len(ctx) == size - pad
                    assert int((ctx == round(factor * mean)).sum()) >= n_long
                    rest = np.sort(ctx)[: len(ctx) - n_long]
                    assert 0.7 * mean < rest.mean() < 1.3 * mean and rest.max() < 2.75 * mean  # log-normal 0.35
    assert len({tuple(b["cached"]) for b in got}) == len(got)


def test_the_report_prices_each_timed_batch_by_the_profile(tmp_path):
    """A timed file whose device times are the profile's own prices reports 1.000 for each."""
    import exp_unsplit_decode as x
    from testbed.assemble import profile_cost_model
    cost = profile_cost_model(REPO / "testbed/sim/costmodel/profiles/h200_qwen3_0_6b.json", "qwen3_0_6b", "h200")
    b = tmp_path / "b.json"
    x.make(b)
    picked = json.loads(b.read_text())["batches"][::37]
    samples = [{"label": d["label"], "extend_lens": d["extend"], "cached_lens": d["cached"],
                "device_s": float(cost.device_time(np.array(d["extend"]), np.array(d["cached"])))} for d in picked]
    timed = tmp_path / "t.json"
    timed.write_text(json.dumps({"model": {"name": "qwen3_0_6b"}, "hardware": {"name": "h200"},
                                 "samples": {"device": samples}}))
    p = subprocess.run([sys.executable, "benchmarks/exp_unsplit_decode.py", "--timed", str(timed)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.strip().splitlines()
    assert len(lines) == len(picked)
    assert all(line.split()[0] == d["label"] and line.endswith("priced 1.000") for line, d in zip(lines, picked))
