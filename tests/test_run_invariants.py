"""What every simulator run's files must say, on runs drawn across every knob at once: each request
finished (its whole output, its token times in order and matching its first-token and finish
times, its prompt computed once beyond its prefix hit, and again on each re-admission)
or rejected; each step's batch adding up, its pages adding up to the pool, its running requests
within the cap, its ids consecutive."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings

from drawn_runs import configurations
from testbed.config import compose
from testbed.run import run


def left_to_decodes(r: pd.DataFrame) -> pd.Series:
    """Per request, the tokens it computed beyond its prefix hit (again on each re-admission) that no
    prefill chunk holds: a re-admission's last recomputed token (the one sampled before the
    preemption) runs as a decode when chunking leaves it alone."""
    return r.prompt_tokens - r.prefix_cached_tokens + r.recomputed_tokens - r.chunk_tokens.map(sum)


def check_files(out, cfg) -> None:
    r = pd.read_parquet(out / "requests.parquet")
    s = pd.read_parquet(out / "steps.parquet")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"], summary["error"]
    assert len(r) == summary["trace"]["num_requests"]
    assert set(r.state) <= {"FINISHED", "REJECTED"}
    for q in r[r.state == "FINISHED"].itertuples():
        tt = q.token_times_s
        assert (q.output_tokens, q.finish_reason) == (q.max_new_tokens, "length"), q.rid  # the sim ignores EOS
        assert len(tt) == q.output_tokens and (np.diff(tt) >= 0).all(), q.rid
        assert (tt[0], tt[-1]) == (q.first_token_s, q.finish_s), q.rid
        assert q.arrival_s <= q.first_scheduled_s <= q.first_token_s <= q.finish_s, q.rid
        assert q.prefill_chunks == len(q.chunk_tokens), q.rid
        assert q.preemptions or not q.recomputed_tokens, q.rid
    fin = r[r.state == "FINISHED"]
    gap = left_to_decodes(fin)
    assert ((gap >= 0) & (gap <= fin.preemptions)).all(), list(fin.rid[(gap < 0) | (gap > fin.preemptions)])
    kv = summary["kv"]["integrity"]
    assert kv["in_use"] == 0
    assert ((s.pages_used + s.pages_cached + s.pages_free) == kv["total"]).all()
    assert (s.batch_reqs == s.prefill_reqs + s.decode_reqs).all() and (s.decode_tokens == s.decode_reqs).all()
    assert (s.prefill_tokens >= s.prefill_reqs).all() and (s.start_s <= s.end_s).all()
    assert (s.running <= cfg.scheduler.max_running).all()
    assert (np.diff(s.step.to_numpy()) == 1).all() and (np.diff(s.start_s.to_numpy()) >= 0).all()


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(configurations())
def test_drawn_runs_files_hold_their_invariants(tmp_path_factory, overrides):
    cfg = compose([*overrides, "progress=false"])
    out = tmp_path_factory.mktemp("run") / "run"
    run(cfg, str(out), print_table=False)
    check_files(out, cfg)


def test_the_check_catches_a_broken_file(tmp_path):
    """check_files fails on a run whose steps lose a page (the check is not vacuous)."""
    cfg = compose(["trace.num_requests=20", "progress=false"])
    out = tmp_path / "run"
    run(cfg, str(out), print_table=False)
    check_files(out, cfg)
    s = pd.read_parquet(out / "steps.parquet")
    s.loc[3, "pages_free"] -= 1
    s.to_parquet(out / "steps.parquet")
    with pytest.raises(AssertionError):
        check_files(out, cfg)


def test_a_recompute_can_end_in_a_decode(tmp_path):
    """Preemptions under the estimated reservation: the invariants hold on a run where a
    re-admission's last recomputed token ran as a decode (what the bound in check_files allows)."""
    cfg = compose(["trace=sharegpt", "policy=chunked", "trace.num_requests=150", "trace.rate=8",
                   "policy.order=priority", "policy.reserve=estimate", "engine.overlap=false",
                   "scheduler.max_running=64", "engine.num_pages=20000", "progress=false"])
    out = tmp_path / "run"
    run(cfg, str(out), print_table=False)
    check_files(out, cfg)
    r = pd.read_parquet(out / "requests.parquet")
    assert r.preemptions.sum() > 0 and (left_to_decodes(r) == 1).any()
