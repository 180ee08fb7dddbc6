"""A fingerprint of the simulator's output files on every bundled trace, policy, eviction
order and cost model: one line per run, the SHA-256 of its requests.parquet and
steps.parquet and of summary.json's metrics. A refactor that must not change behaviour
keeps every line; diff the output of the commit before against the commit after.

    python benchmarks/sim_fingerprint.py [--requests 300] > fingerprint.txt
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRACES = ["sharegpt", "azure_conv", "azure_code", "arxiv", "bwb", "mooncake_conversation", "mooncake_synthetic",
          "synthetic"]
POLICIES = ["prefill_first", "decode_first", "chunked"]
# the other axes, each varied on its own from the first run's setting
EXTRA = [["cache=none"],
         ["costmodel=roofline"], ["model=qwen3_0_6b"], ["engine.overlap=false"], ["policy.order=sjf"],
         ["engine.num_pages=3000"], ["engine.tp=2"], ["engine.page_size=16"]]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def one(overrides: list[str]) -> str:
    from testbed.config import compose
    from testbed.run import run
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "run"
        try:
            s = run(compose(overrides), str(out), print_table=False)
        except Exception as e:  # a configuration that fails must keep failing the same way
            return f"error {type(e).__name__}: {e}"
        metrics = hashlib.sha256(json.dumps(s["metrics"], sort_keys=True).encode()).hexdigest()[:16]
        return f"requests {digest(out / 'requests.parquet')} steps {digest(out / 'steps.parquet')} metrics {metrics}"


def runs() -> list[list[str]]:
    """Every run's overrides (beside trace.num_requests and progress)."""
    out = [[f"trace={t}", f"policy={p}"] for t in TRACES for p in POLICIES]
    out += [["trace=sharegpt", "policy=chunked"] + x for x in EXTRA]
    # eviction orders where the KV pool is small enough for them to act
    out += [["trace=mooncake_conversation", "policy=chunked", "engine.num_pages=20000", f"eviction={e}"]
            for e in ("lru", "fifo", "lfu", "slru", "priority")]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    a = ap.parse_args(argv)
    base = ["progress=false", f"trace.num_requests={a.requests}"]
    for r in runs():
        print(" ".join(r), "|", one(base + r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
