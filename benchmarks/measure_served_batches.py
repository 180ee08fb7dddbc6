"""Time a list of served batches on the engine as the step profiler times them, into a file that
`python -m testbed.profile refit=PROFILE local_from=FILE` takes: a profile's served-batch
shapes measured on their own, without the rest of its grid (one machine start's few minutes).

    python benchmarks/measure_served_batches.py pick --profile P --out BATCHES.json [--served 150] [--decodes 60]  # CPU
    python benchmarks/measure_served_batches.py time --profile P --batches BATCHES.json --out FILE   # GPU
        [--set KEY=VALUE ...]  # engine overrides beyond the defaults (the tests: --set engine.device=cpu ...)

`pick` draws the batches as the profiler does (testbed/fidelity/served_batches.py) for the
deployment of profile P, and beside them decode-only batches of `DECODE_ROWS` rows or more
(the decode graphs' served shapes, for their analysis: refit takes the mixed ones); `time` measures each (the profiler's time_shape: median of repeats,
device held until the step is enqueued) and writes FILE with P's model and engine records, this
machine's, and the samples (pattern batch)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DECODE_ROWS = 33  # decode graphs of more rows are where served ones mispriced (2-4% at 96, 160-176)


def pick(a) -> None:
    from testbed.fidelity.batches import is_mixed
    from testbed.fidelity.served_batches import pick as spread, pick_decodes, simulated_batches
    from testbed.sim.costmodel.fit import Fa2Shape
    prof = json.loads(a.profile.read_text())
    fa = prof["device"]["eager"].get("fa2")
    if not fa:
        raise SystemExit(f"error: {a.profile} has no fa2 plan shape (its prefill kernel is not fa2)")
    dep = [f"model={prof['model']['name']}", f"hardware={prof['hardware']['name']}", "model.weights=dummy"]
    decode = lambda e: bool((e == 1).all()) and len(e) >= DECODE_ROWS  # noqa: E731
    every = simulated_batches(dep, keep=lambda e: is_mixed(e) or decode(e))
    got = [("mixed", b) for b in spread([b for b in every if is_mixed(b[0])], a.served, Fa2Shape(**fa))]
    got += [("decode", b) for b in pick_decodes([b for b in every if decode(b[0])], a.decodes,
                                                prof["engine"]["graph_sizes"])]
    a.out.write_text(json.dumps({"profile": str(a.profile), "batches": [
        {"kind": k, "extend": e.tolist(), "cached": c.tolist()} for k, (e, c) in got]}) + "\n")
    print(f"{len(got)} batches written to {a.out}")


def time_them(a) -> None:
    from probe_engine import probe_engine
    from testbed.engine.profiler import Shape, machine_info, shape_record, time_shape
    prof = json.loads(a.profile.read_text())
    batches = json.loads(a.batches.read_text())["batches"]
    spec, s, parts, ex, cps = probe_engine(prof["model"]["name"], a.overrides)
    if list(parts.graphs.sizes if parts.graphs is not None else []) != prof["engine"]["graph_sizes"]:
        raise SystemExit(f"error: this engine's graph sizes differ from {a.profile}'s")
    samples = []
    for b in batches:
        sh = Shape(b.get("kind", "mixed"), b["extend"], b["cached"], "batch", max(b["cached"]))
        samples.append(shape_record(sh) | ({"label": b["label"]} if "label" in b else {})
                       | time_shape(ex, sh.extend, sh.cached, parts.slots, s.page_size, spec.vocab_size, a.repeats, cps))
    out = {"model": prof["model"], "hardware": prof["hardware"], "engine": prof["engine"],
           "machine": machine_info(parts.device), "samples": {"device": samples}}
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(samples)} batches timed into {a.out}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("pick", "time"))
    ap.add_argument("--profile", type=Path, required=True)
    ap.add_argument("--batches", type=Path)
    ap.add_argument("--served", type=int, default=150)
    ap.add_argument("--decodes", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                    help="an engine override for time (repeatable)")
    a = ap.parse_args()
    pick(a) if a.what == "pick" else time_them(a)


if __name__ == "__main__":
    main()
