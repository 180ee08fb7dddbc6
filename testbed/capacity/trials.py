"""One rate of one policy as an ordinary run (testbed.run.run, the run machinery every entry
point uses), in its own run directory under the search's directory. Each directory also gets
the overrides it ran with in Hydra's .hydra/overrides.yaml, which is what analysis.load reads
to tell jobs apart: `python -m testbed.report OUT` then treats the search as a sweep over
policy and trace.rate."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Trials:
    """The runs of one search: a row per run, in the order they ran."""
    overrides: list[str]  # the command line's run overrides, for every run
    out: Path
    rows: list[dict] = field(default_factory=list)

    def run(self, policy: str, rate: float, role: str, target: float) -> dict:
        from testbed.config import compose
        from testbed.run import run
        overrides = [*self.overrides, f"policy={policy}", f"trace.rate={rate:g}"]
        if not any(o.split("=", 1)[0].lstrip("+~") == "progress" for o in self.overrides):
            overrides.append("progress=false")  # a line per run is printed instead
        cfg = compose(overrides)
        job = self.out / f"{len(self.rows)}_policy={policy},trace.rate={rate:g}"
        summary = run(cfg, str(job), print_table=False)
        hydra = job / ".hydra"
        hydra.mkdir(exist_ok=True)
        (hydra / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides if o != "progress=false"))
        m = summary["metrics"]
        row = {"policy": policy, "rate": rate, "role": role, "slo_attainment": m["slo_attainment"],
               "meets": m["slo_attainment"] >= target, "request_goodput": m["request_goodput"],
               "request_throughput": m["request_throughput"], "completed": m["completed"], "failed": m["failed"],
               "p99_ttft_ms": m["p99_ttft_ms"], "p99_tpot_ms": m["p99_tpot_ms"], "p99_e2el_ms": m["p99_e2el_ms"],
               "run_dir": str(job)}
        self.rows.append(row)
        return row
