"""`python -m testbed.export DIR --format vllm|aiperf [--out FILE]`: write a run directory's
results as another tool's result file (see testbed/export/__init__.py)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

FORMATS = {"vllm": "vllm_bench_result.json", "aiperf": "profile_export.jsonl"}  # format -> default file in DIR


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):  # argparse prints the usage block first; one line is enough
        self.exit(2, f"error: {message} (python -m testbed.export --help)\n")


def parse_args(argv):
    p = OneLineParser(prog="python -m testbed.export", description=__doc__.split("\n\n")[0])
    p.add_argument("dir", help="a run directory (requests.parquet, summary.json) of either backend")
    p.add_argument("--format", required=True, choices=sorted(FORMATS),
                   help="vllm: vllm bench serve's result JSON; aiperf: AIPerf's profile_export.jsonl")
    p.add_argument("--out", default=None,
                   help=f"file to write, '-' for stdout (default: DIR/{FORMATS['vllm']} or DIR/{FORMATS['aiperf']})")
    p.add_argument("--percentiles", default="99",
                   help="vllm: the percentiles of each latency, as vllm bench serve's --metric-percentiles "
                        "(default 99; e.g. 50,90,99)")
    p.add_argument("--detailed", action="store_true",
                   help="vllm: the per-request lists too (input_lens, output_lens, ttfts, itls, latencies, "
                        "start_times, errors), as --save-detailed")
    return p.parse_args(argv)


def parse_percentiles(text: str) -> tuple[float, ...]:
    try:
        out = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--percentiles {text!r}: not a comma-separated list of numbers") from None
    bad = [p for p in out if not 0 < p <= 100]
    if bad:
        raise ValueError(f"--percentiles {text!r}: {bad[0]:g} is not in (0, 100]")
    return out


def render(run, fmt: str, percentiles, detailed: bool) -> str:
    if fmt == "vllm":
        from testbed.export.vllm_bench import vllm_result
        return json.dumps(vllm_result(run, percentiles, detailed), allow_nan=False) + "\n"
    from testbed.export.aiperf import aiperf_records
    return "".join(json.dumps(r, allow_nan=False) + "\n" for r in aiperf_records(run))


def write(text: str, out: str) -> None:
    """The whole file or none: written to a temporary name, then renamed."""
    path = Path(out)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OSError(f"could not write {path} ({e.strerror or e})") from None


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from testbed.export.rundir import ExportError, read_run
    try:
        percentiles = parse_percentiles(args.percentiles)
        run = read_run(args.dir)
        text = render(run, args.format, percentiles, args.detailed)
        if run.summary.get("complete") is False:
            print(f"note: {run.path} is a run cut short ({run.summary.get('error')}): exported the requests it "
                  f"holds, those that did not finish as failed", file=sys.stderr)
        if not run.summary.get("started_at"):
            print(f"note: the run's start is {run.started_from}", file=sys.stderr)
        if args.out == "-":
            sys.stdout.write(text)
            return 0
        out = args.out or str(run.path / FORMATS[args.format])
        write(text, out)
    except (ExportError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    n = text.count("\n")
    print(f"wrote {out}" + (f" ({n} records)" if args.format == "aiperf" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
