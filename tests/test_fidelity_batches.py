"""Rebuilding every step's batch from a run's Parquet files (testbed/fidelity/batches.py): on a
simulated run, the rebuilt batches priced by the cost model give back each step's own
predicted_s (the simulator prices the true batch), preemption included."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from testbed import assemble
from testbed.config import compose
from testbed.fidelity.batches import device_error_table, step_batches, step_device_errors
from testbed.run import run


def simulate(tmp_path, extra):
    ov = ["model=qwen3_0_6b", "costmodel=calibrated", "costmodel.profile=h200_qwen3_0_6b", "progress=false",
          "trace=sharegpt", "trace.num_requests=120", "trace.rate=30", *extra]
    cfg = compose(ov)
    run(cfg, str(tmp_path / "run"), print_table=False)
    r = pd.read_parquet(tmp_path / "run/requests.parquet")
    s = pd.read_parquet(tmp_path / "run/steps.parquet")
    return r, s, assemble.cost_model(cfg, assemble.model_spec(cfg))[0]


@pytest.mark.parametrize("policy", ["chunked", "prefill_first", "decode_first"])
def test_rebuilt_batches_price_as_the_simulator_priced_them(tmp_path, policy):
    r, s, cost = simulate(tmp_path, [f"policy={policy}"])
    batches = step_batches(r, s)
    assert len(batches) == len(s) and all(b is not None for b in batches)
    pred = np.array([cost.device_time(*b) for b in batches])
    assert np.allclose(pred, s["predicted_s"], rtol=1e-12, atol=0)
    kinds = set(step_device_errors(r, s, cost)["kind"])
    assert "decode_graph" in kinds and ({"mixed"} if policy == "chunked" else {"prefill"}) <= kinds


def test_woken_steps_are_priced_with_the_wake_as_the_simulator_charged_them(tmp_path):
    """At a light load most prefills follow an idle gap: their price is the device model's plus
    the profile's wake device seconds, and a device-bound woken step ran exactly that long in
    the simulator; every other step is priced at the device model alone."""
    from testbed.timeline.idle import idle_before
    r, s, cost = simulate(tmp_path, ["policy=prefill_first", "trace.num_requests=30", "trace.rate=2"])
    gap, _, _, extra = cost.wake
    assert extra > 0
    err = step_device_errors(r, s, cost)
    assert len(err) == len(s) and err["woken"].sum() >= 5
    woken = idle_before(s["start_s"], s["end_s"], s["complete_s"]) > gap
    assert (err["woken"].to_numpy() == woken).all()
    assert np.allclose(err["predicted_s"], s["predicted_s"] + np.where(woken, extra, 0.0), rtol=1e-12, atol=0)
    # the simulator ran each woken step for its device time plus the wake (the host's
    # launch can only lengthen it)
    assert (s["duration_s"][woken] >= err["predicted_s"][woken] - 1e-12).all()
    assert np.isclose(s["duration_s"][woken], err["predicted_s"][woken], rtol=1e-9).any()


def test_steps_of_preempted_requests_are_left_out(tmp_path):
    r, s, cost = simulate(tmp_path, ["policy=chunked", "policy.reserve=estimate", "engine.num_pages=3000", "trace.rate=200"])
    assert r["preemptions"].sum() > 0
    batches = step_batches(r, s)
    known = [i for i, b in enumerate(batches) if b is not None]
    assert 0 < len(known) < len(s)
    pred = np.array([cost.device_time(*batches[i]) for i in known])
    assert np.allclose(pred, s["predicted_s"].to_numpy()[known], rtol=1e-12, atol=0)
    t = device_error_table(step_device_errors(r, s, cost))
    assert t["steps"].sum() == len(known) and (t["median_ratio"] > 0).all()


def test_a_token_time_no_step_ends_at_is_one_line_error(tmp_path):
    r, s, _ = simulate(tmp_path, ["policy=chunked"])
    s = s.assign(end_s=s["end_s"] + 1e-3)
    with pytest.raises(ValueError, match=r"request \d+: time .* is no step's start or end"):
        step_batches(r, s)


def test_steps_sharing_a_start_time_are_left_out_and_the_others_rebuilt(tmp_path):
    """A cost model without host time (the roofline) schedules the next step at the instant the
    first starts: the files cannot say which of the two a chunk went to, so both are unknown
    (None), and every other step is rebuilt as the simulator priced it."""
    run(compose(["model=qwen3_0_6b", "costmodel=roofline", "progress=false", "policy=chunked", "trace=sharegpt",
                 "trace.num_requests=60", "trace.rate=inf"]), str(tmp_path / "run"), print_table=False)
    r, s = pd.read_parquet(tmp_path / "run/requests.parquet"), pd.read_parquet(tmp_path / "run/steps.parquet")
    shared = s["start_s"].duplicated(keep=False).to_numpy() | s["end_s"].duplicated(keep=False).to_numpy()
    assert shared.any() and not shared.all()
    batches = step_batches(r, s)
    assert [b is None for b in batches] == shared.tolist()
    for b, (_, row) in zip(batches, s.iterrows()):
        if b is not None:
            e, c = b
            assert (len(e), e.sum(), (e + c).sum()) == (
                row["batch_reqs"], row["prefill_tokens"] + row["decode_tokens"], row["context_tokens"])


def test_the_report_names_what_each_missing_cells_figures_show():
    """A cell beyond 5% is listed with its metrics and only the findings its figures support;
    cells within the bar are not listed, and a report with none has no such section."""
    from testbed.fidelity.misses import misses_section

    def err(e, spread=0.0):
        return {"engine": [1.0, 1.0], "sim": 1.0 + e, "error": e, "spread": spread}

    def steps(kind, eng_ms, sim_ms, n=100):
        return [{"who": "engine", "kind": kind, "steps": n, "interval": eng_ms},
                {"who": "sim", "kind": kind, "steps": n, "interval": sim_ms}]
    slow_host = {"errors": {"mean_ttft_ms": err(-0.09, spread=0.06), "p90_tpot_ms": err(0.01)},
                 "host_ratio": [1.46, 1.43], "steps": steps("mixed", 2.84, 2.61) + steps("decode", 1.0, 1.001),
                 "device_steps": [{"kind": "mixed", "requests": "65-128", "steps": 40, "time_ratio": 1.027},
                                  {"kind": "decode_graph", "requests": "1-8", "steps": 60, "time_ratio": 0.995}]}
    plain = {"errors": {"p90_ttft_ms": err(0.063)}, "host_ratio": [0.95, 1.05], "steps": steps("decode", 3.0, 3.01),
             "device_steps": [{"kind": "decode_graph", "requests": "9-32", "steps": 10, "time_ratio": 0.99}]}
    fine = {"errors": {"mean_ttft_ms": err(0.049)}, "host_ratio": [2.0, 2.0]}
    text = "\n".join(misses_section({"a": slow_host, "b": plain, "c": fine, "d": {"missing": "no engine run"}}))
    a, b = text.split("- **a**: ")[1].split("- **b**: ")
    assert a.startswith("mean TTFT -9.0%\n") and "p90 TPOT" not in a  # only the metrics beyond the bar
    assert "differ by 6.0% on mean TTFT" in a and "1.46 / 1.43x the profile's host time" in a
    assert "mixed steps add 0.919x the engine's time" in a and "decode steps add" not in a  # 0.1% off: not named
    assert "mixed steps of 65-128 requests are priced at 1.027" in a and "decode_graph" not in a
    assert b.startswith("p90 TTFT +6.3%\n") and "no step kind is 2% or more off" in b and "host" not in b
    assert "**c**" not in text and "**d**" not in text
    assert misses_section({"c": fine}) == []
