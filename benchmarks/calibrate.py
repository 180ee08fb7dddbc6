"""Fit the simulator's calibrated cost model to a GPU engine run.

    python benchmarks/calibrate.py RUN_DIR --out testbed/sim/costmodel/profiles/<name>.json
    python benchmarks/calibrate.py RUN_DIR --out /tmp/half.json --fit-fraction 0.5   # hold out the second half

RUN_DIR is a `backend=engine` run directory (steps.parquet with the measured `duration_s`
per step, summary.json). Per step kind (`graph`: decode-only, replayed as a CUDA graph;
`eager`: a prefill chunk in the batch), a non-negative least-squares fit of the step's
device time on a fixed term, the requests in the batch, the new tokens and the KV tokens
read (testbed/sim/costmodel/calibrated.py says why these). The target is the wall-clock time
each step adds to the engine's timeline (overlap scheduling included; `--target device`:
the device time per step instead). Prints the coefficients and the
fit's error per step kind (and the roofline's, from the run's `predicted_s`, beside it),
and writes the profile JSON: coefficients, feature definitions, the model / hardware /
engine settings and versions of the run, the source run and its date.

Use it with `python -m testbed.run costmodel=calibrated costmodel.profile=<name or path> ...`.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from testbed.sim.costmodel.calibrated import fit_profile, write_profile  # noqa: E402


def fmt_errors(title: str, errs: dict) -> list[str]:
    lines = [f"{title}:", f"  {'kind':<8} {'n':>6} {'meas p50 ms':>11} {'pred p50 ms':>11} "
                          f"{'p50 |rel|':>9} {'p90 |rel|':>9} {'bias':>7} {'total':>7}"]
    for kind, e in errs.items():
        if not e.get("n"):
            continue
        lines.append(f"  {kind:<8} {e['n']:>6} {e['measured_median_ms']:>11.3f} {e['predicted_median_ms']:>11.3f} "
                     f"{e['median_abs_rel_err']:>9.1%} {e['p90_abs_rel_err']:>9.1%} {e['mean_rel_err']:>+7.1%} "
                     f"{e['total_time_rel_err']:>+7.1%}")
    return lines


def report(prof: dict) -> str:
    src = prof["source"]
    lines = [f"profile {prof['name']}: {prof['model']['name']} on {prof['hardware'].get('name')}, "
             f"tp={prof['engine']['tp']}, cuda_graph_max_bs={prof['engine']['cuda_graph_max_bs']}, "
             f"from {src['run']} ({src['run_date']})",
             f"fitted on steps {src['fit_steps'][0]}..{src['fit_steps'][1]} of {src['steps_total']} "
             f"(fit_fraction {src['fit_fraction']}, first {src['skip_first']} skipped; until t={src['fit_until_s']:.1f} s)"]
    for kind, k in prof["kinds"].items():
        c = k["coef_s"]
        terms = "  ".join(f"{f}={v * 1e6:.4g} us" for f, v in c.items())
        lines.append(f"  {kind:<6} {terms}")
    fit = prof["fit"]
    lines += fmt_errors(f"fit of the {prof['target']} time, in sample (units: {fit['units']})", fit["in_sample"])
    if "held_out" in fit:
        lines += fmt_errors("fit, held out (the steps after the fitted part)", fit["held_out"])
    lines += fmt_errors("calibrated against the device time per step (duration_s), all steps",
                        fit["device_time_per_step"])
    if "roofline_device_time_per_step" in fit:
        lines += fmt_errors("roofline (the run's predicted_s) against the device time per step",
                            fit["roofline_device_time_per_step"])
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path, help="a backend=engine run directory (steps.parquet, summary.json)")
    ap.add_argument("--out", type=Path, required=True, help="profile JSON to write")
    ap.add_argument("--name", default=None, help="profile name (default: the --out file's stem)")
    ap.add_argument("--fit-fraction", type=float, default=1.0,
                    help="fit on this first fraction of the steps, report the rest as held out (default 1)")
    ap.add_argument("--target", choices=("wall", "device"), default="wall",
                    help="wall: the engine's wall-clock time per step, overlap included (default); "
                         "device: the measured device time per step (duration_s)")
    ap.add_argument("--skip-first", type=int, default=1, help="leave out the first N steps (warm-up; default 1)")
    a = ap.parse_args(argv)
    try:
        prof = fit_profile(a.run_dir, fit_fraction=a.fit_fraction, name=a.name or a.out.stem,
                           skip_first=a.skip_first, target=a.target)
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    path = write_profile(prof, a.out)
    print(report(prof))
    print(f"written {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
