"""The experiment's matrix and its plan: which cells, and each cell's run overrides.

A cell is a model, a policy, a trace and a load. The load is a fraction of the deployment's
capacity for that policy and trace: the simulator (calibrated cost model) replays the
trace's first `CAPACITY_REQUESTS` requests all at once and the capacity is the requests
finished per second. A cell then replays `max(MIN_REQUESTS, rate x CELL_SECONDS)` requests
at load x capacity: Poisson arrivals for traces without timestamps (trace.rate), the
trace's own timestamps compressed (trace.time_scale) for traces with them."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

POLICIES = ("prefill_first", "decode_first", "chunked")
TRACES = ("sharegpt", "azure_conv", "mooncake_conversation")
LOADS = {"light": 0.25, "mid": 0.6, "high": 0.9}
TIMESTAMPED = ("azure_conv", "azure_code", "mooncake_conversation", "mooncake_synthetic")
CAPACITY_REQUESTS = 400
CELL_SECONDS = 8.0  # arrivals span about this long...
MIN_REQUESTS = 40  # ...with at least this many requests...
MAX_CELL_SECONDS = 14.0  # ...unless that would make them span longer than this (light loads of slow traces)
COMMON = ("model.weights=dummy", "progress=false")
HARDWARE = "h200"  # the GPU the committed experiment ran on; `hardware=` plans one for another


@dataclasses.dataclass
class Cell:
    name: str
    model: str
    policy: str
    trace: str
    load: str
    capacity_rps: float
    rate_rps: float
    num_requests: int
    overrides: list[str]
    profile: str = ""  # the simulator's profile (a name or path); "" = <hardware>_<model>


def default_matrix() -> list[tuple[str, str, str, str]]:
    """Every policy x trace x load on Qwen3-0.6B; the chunked cells of sharegpt on Llama-3.1-8B."""
    cells = [("qwen3_0_6b", p, t, ld) for t in TRACES for p in POLICIES for ld in LOADS]
    cells += [("llama3_8b", "chunked", "sharegpt", ld) for ld in LOADS]
    return cells


def base_overrides(model: str, policy: str, trace: str, hardware: str = HARDWARE) -> list[str]:
    return [f"model={model}", f"policy={policy}", f"trace={trace}", *COMMON, f"hardware={hardware}"]


def profile_name(overrides: list[str], profile: str = "") -> str:
    """The simulator's profile for a cell: `profile`, or the <hardware>_<model> its overrides name."""
    return profile or f"{overrides_value(overrides, 'hardware')}_{overrides_value(overrides, 'model')}"


def simulator_overrides(overrides: list[str], profile: str = "") -> list[str]:
    """A cell's overrides as the simulator runs it: the calibrated model with `profile`
    (default <hardware>_<model>)."""
    return overrides + ["backend=sim", "costmodel=calibrated", f"costmodel.profile={profile_name(overrides, profile)}"]


def _sim_summary(overrides: list[str]) -> dict:
    import tempfile

    from testbed.config import compose
    from testbed.run import run
    with tempfile.TemporaryDirectory() as d:
        return run(compose(simulator_overrides(overrides)), d, print_table=False)


def overrides_value(overrides: list[str], key: str) -> str:
    for o in overrides:
        if o.startswith(key + "="):
            return o.split("=", 1)[1]
    raise KeyError(key)


def native_rate(overrides: list[str], n: int) -> float:
    """Requests per second of a timestamped trace's first n requests at time_scale 1 (over at
    least 100: the first few may share a timestamp)."""
    from testbed import assemble
    from testbed.config import compose
    cfg = compose(overrides + [f"trace.num_requests={n}"])
    tr = assemble.trace_for(cfg, assemble.model_spec(cfg))
    a = sorted(r.arrival_s for r in tr.requests)
    return (len(a) - 1) / (a[-1] - a[0])


def capacity(model: str, policy: str, trace: str, hardware: str = HARDWARE) -> float:
    o = base_overrides(model, policy, trace, hardware) + [f"trace.num_requests={CAPACITY_REQUESTS}"]
    o += ["trace.time_scale=1e-9"] if trace in TIMESTAMPED else ["trace.rate=inf"]
    return _sim_summary(o)["metrics"]["request_throughput"]


def cell_name(model: str, policy: str, trace: str, load: str) -> str:
    return f"{model}-{policy}-{trace}-{load}"


def plan_cells(matrix=None, hardware: str = HARDWARE) -> list[Cell]:
    """The cells of `matrix` (default_matrix()) on `hardware`, each load a fraction of the
    capacity the simulator finds with that hardware's profile of the model."""
    caps: dict[tuple, float] = {}
    out = []
    for model, policy, trace, load in matrix or default_matrix():
        key = (model, policy, trace)
        if key not in caps:
            caps[key] = capacity(*key, hardware)
        rate = LOADS[load] * caps[key]
        n = min(max(MIN_REQUESTS, int(math.ceil(rate * CELL_SECONDS))), max(2, int(rate * MAX_CELL_SECONDS)))
        o = base_overrides(model, policy, trace, hardware) + [f"trace.num_requests={n}"]
        if trace in TIMESTAMPED:
            o.append(f"trace.time_scale={native_rate(o, max(n, 100)) / rate:.6g}")
        else:
            o.append(f"trace.rate={rate:.6g}")
        out.append(Cell(cell_name(model, policy, trace, load), model, policy, trace, load, caps[key], rate, n, o))
    return out


def write_plan(cells: list[Cell], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([dataclasses.asdict(c) for c in cells], indent=1) + "\n")
    return path


def read_plan(path: Path) -> list[Cell]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no plan; write one with `python -m testbed.fidelity plan out={path.parent}`")
    return [Cell(**c) for c in json.loads(path.read_text())]
