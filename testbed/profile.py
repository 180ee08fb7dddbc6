"""`python -m testbed.profile model=... [engine.*=...] [policy.*=...] [out=PATH] [repeats=N]`:
profile the real engine over a grid of step shapes and write the simulator's calibrated
cost-model profile.

The arguments are `testbed.run`'s Hydra overrides (same groups: model, engine, policy,
hardware) plus the profiler's own:

  out=PATH        profile JSON to write (default testbed/sim/costmodel/profiles/<hardware>_<model>.json)
  repeats=N       launches per shape and mode, median taken (default 5)
  policies=A,B    policies whose host cost is profiled (default chunked,prefill_first,decode_first)
  quick=true      a small grid (a CPU smoke test; the profile is not for simulation)
  served=N        mixed batches as the policies serve them in the grid, about N
                  (testbed/fidelity/served_batches.py: the simulator's on the bundled traces; default
                  150, 0: none; none where the prefill kernel is not flashinfer's fa2)
  served_out=PATH no measuring: compute the served batches (CPU only) into PATH and stop; on the
                  GPU machine `served_from=PATH` then takes them instead of simulating there
                  (~2 min of device time a profile, on a 16-core GPU host)
  served_from=PATH the served batches from a served_out= file of the same deployment and served=N
  refit=PATH      no measuring: fit a profile's stored samples again with the current fit
                  (after a change to testbed/sim/costmodel/fit.py); writes out= or PATH
  host_from=A,B   with refit: add the host workloads of these profiles (other machine starts of
                  the same deployment) to the host fit
  device_from=A,B with refit: pool the device grids of these profiles with PATH's (per shape,
                  the median over the starts that measured it)
  local_from=A,B  with refit: these profiles' mixed shapes join the profile's own (kept in its
                  samples.local) as the measured shapes whose residuals correct the mixed steps
                  near them (fit.LocalCorrection); the eager fit itself stays on the own grid
  graph_samples_from=A,B  with refit: these files' CUDA-graph decode samples join the grid's in
                  the graph fit at the sizes that run them: served steps of engine runs on other
                  machine starts (benchmarks/runs_as_samples.py), measured as served
  graph_from=A,B  with refit: the CUDA-graph decode shapes from these profiles' grids instead
                  (one grid as measured; several pooled as device_from pools), the other shapes
                  as above: a decode-graph grid re-measured with a profiler change, the rest kept

What is measured and how it is fitted: testbed/engine/profiler.py and
testbed/sim/costmodel/calibrated.py. A model's profile costs a few minutes on a GPU."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

OWN = {"out": None, "repeats": "5", "policies": None, "quick": "false", "host_requests": None, "refit": None,
       "served": "150", "served_out": None, "served_from": None,
       "host_from": None, "device_from": None, "graph_from": None, "local_from": None, "graph_samples_from": None}


def parse(argv: list[str]) -> tuple[dict, list[str]]:
    own, overrides = dict(OWN), []
    for a in argv:
        key = a.split("=", 1)[0]
        if key in OWN and "=" in a:
            own[key] = a.split("=", 1)[1]
        else:
            overrides.append(a)
    return own, overrides


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    own, overrides = parse(sys.argv[1:] if argv is None else argv)
    if not any(o.startswith("backend=") for o in overrides):
        overrides.append("backend=engine")
    if own["refit"]:
        extra = [Path(p) for p in own["host_from"].split(",")] if own["host_from"] else []
        dev = [Path(p) for p in own["device_from"].split(",")] if own["device_from"] else []
        graph = [Path(p) for p in own["graph_from"].split(",")] if own["graph_from"] else []
        local = [Path(p) for p in own["local_from"].split(",")] if own["local_from"] else []
        served = [Path(p) for p in own["graph_samples_from"].split(",")] if own["graph_samples_from"] else []
        return refit(Path(own["refit"]), Path(own["out"]) if own["out"] else None, extra, dev, graph, local, served)
    if own["host_from"] or own["device_from"] or own["graph_from"] or own["local_from"] or own["graph_samples_from"]:
        print("error: host_from=, device_from=, graph_from=, local_from= and graph_samples_from= go with refit=PATH",
              file=sys.stderr)
        return 2
    try:
        from testbed import assemble
        from testbed.config import compose
        from testbed.sim.costmodel.calibrated import PROFILES_DIR, write_profile
        from testbed.sim.costmodel.fit import fit_profile, report

        cfg = compose(overrides)
        repeats = int(own["repeats"])
        if repeats < 1:
            raise ValueError(f"repeats={repeats} is invalid; allowed: an integer >= 1")
        quick = own["quick"].lower() in ("1", "true", "yes")
        spec = assemble.model_spec(cfg)
        out = Path(own["out"]) if own["out"] else PROFILES_DIR / f"{cfg.hardware['name']}_{cfg.model.name}.json"
        served = int(own["served"]) if own["served"].isdigit() else -1
        if served < 0:
            raise ValueError(f"served={own['served']} is invalid; allowed: an integer >= 0")
        if own["served_out"]:
            batches = served_batches(cfg, spec, overrides, served)
            path = write_served(Path(own["served_out"]), deployment(cfg, spec), served, batches)
            print(f"written {path}: {len(batches)} served batches")
            return 0
        # what is wrong with the settings, before the served batches (a minute) and the engine's build
        settings = assemble.engine_settings(cfg, spec)
        from policies import POLICIES
        from testbed.engine.profiler import HOST_POLICIES, run_profile  # imports torch
        policies = own["policies"].split(",") if own["policies"] else list(HOST_POLICIES)
        known = POLICIES.names()
        for name in policies:
            if name not in known:
                raise ValueError(f"policies={own['policies']}: {name!r} is unknown; allowed: {', '.join(known)}")
        if own["served_from"]:
            batches = [] if quick else read_served(Path(own["served_from"]), deployment(cfg, spec), served)
        else:
            batches = served_batches(cfg, spec, overrides, 0 if quick else served)
        raw = run_profile(settings, spec, assemble.scheduler_per_policy(cfg, spec),
                          repeats=repeats, quick=quick, policies=policies,
                          host_requests=int(own["host_requests"]) if own["host_requests"] else None,
                          batches=batches)
        prof = fit_profile(raw, deployment(cfg, spec), spec, prefill_plan(cfg, spec, raw), name=out.stem)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    path = write_profile(prof, out)
    print(report(prof))
    print(f"written {path}")
    return 0


def deployment(cfg, spec) -> dict:
    """What a profile records of the deployment it measured (its model, hardware, engine
    settings, limits and policy): the config stops here, the fit takes this record."""
    import dataclasses

    from testbed.config import resolved_overlap
    from testbed.sim.costmodel.fit import MODEL_FIELDS
    e, lim = cfg.engine, cfg.scheduler
    return {
        "model": {"name": cfg.model.name, **{f: getattr(spec, f) for f in MODEL_FIELDS}, "weights": cfg.model.weights},
        "hardware": dict(cfg.hardware),
        "engine": {"tp": e.tp, "page_size": e.page_size, "attention": e.resolved_attention(), "kernels": e.kernels,
                   "dtype": e.dtype, "overlap": resolved_overlap(cfg), "cuda_graph_max_bs": e.cuda_graph_max_bs,
                   "prefill_backend": e.prefill_backend, "decode_tensor_cores": e.decode_tensor_cores,
                   "max_running": lim.max_running, "max_step_tokens": lim.max_step_tokens,
                   # recorded when on (the profiles measured before the option have no such key), with
                   # what the simulator needs to tell the steps it takes (fit.whole_step_rule)
                   **({"whole_step_graphs": whole_step_record()} if e.whole_step_graphs else {})},
        "policy": dataclasses.asdict(cfg.policy),
    }


def local_source(p: Path, what: str = "local_from") -> dict:
    """A local_from (or graph_samples_from) file: a profile, or benchmarks/measure_served_batches.py's
    served batches, or benchmarks/runs_as_samples.py's served steps (their model, engine and
    machine records and device samples, no fits)."""
    import json
    try:
        other = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{what}={p}: cannot be read as JSON ({err})") from err
    missing = [k for k in ("model", "engine", "machine", "samples") if k not in other]
    if missing or "device" not in other.get("samples", {}):
        raise ValueError(f"{what}={p}: not a profile or served batches' file (missing "
                         f"{', '.join(missing) or 'samples.device'})")
    return other


def served_batches(cfg, spec, overrides: list[str], n: int) -> list:
    """About n mixed batches as the deployment's policies serve them (the simulator's), or none
    where the fa2 plan that groups them is unknown (another prefill kernel)."""
    from testbed.sim.costmodel.fit import fa2_shape
    fa = fa2_shape(spec, cfg.engine, dict(cfg.hardware).get("num_sms", 0))
    if n == 0 or fa is None:
        return []
    from testbed.fidelity.served_batches import pick, simulated_batches
    deployment = [o for o in overrides if not o.startswith("backend=")]
    batches = pick(simulated_batches(deployment), n, fa)
    logging.getLogger(__name__).info("%d served batches for the grid", len(batches))
    return batches


def write_served(path: Path, dep: dict, n: int, batches) -> Path:
    """served_out=: the batches with the deployment and served=N they were made for."""
    import json
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"deployment": dep, "served": n,
                                "batches": [[e.tolist(), c.tolist()] for e, c in batches]}) + "\n")
    return path


def read_served(path: Path, dep: dict, n: int) -> list:
    """served_from=: the batches of a served_out= file, if it was made for this deployment and n."""
    import json

    import numpy as np
    try:
        got = json.loads(path.read_text())
        made_for, made_n, rows = got["deployment"], got["served"], got["batches"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"served_from={path}: not a served_out= file ({type(err).__name__}: {err})") from err
    if made_n != n:
        raise ValueError(f"served_from={path} holds served={made_n}; this profile asks served={n}")
    differ = _differences(made_for, json.loads(json.dumps(dep)))
    if differ:
        raise ValueError(f"served_from={path} was made for another deployment: {'; '.join(differ[:4])}")
    return [(np.array(e, np.int64), np.array(c, np.int64)) for e, c in rows]


def _differences(a, b, where: str = "") -> list[str]:
    """The keys whose values differ between two JSON records, as 'key: file X, run Y'."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b))
                for d in _differences(a.get(k), b.get(k), f"{where}.{k}" if where else k)]
    return [] if a == b else [f"{where}: file {a!r}, run {b!r}"]


def whole_step_record() -> dict:
    from testbed.engine.whole_graphs import MAX_TOKENS, SLOTS
    return {"max_tokens": MAX_TOKENS, "slots": list(SLOTS)}


def prefill_plan(cfg, spec, raw: dict):
    """The fa2 prefill plan's inputs of the measured deployment (its GPU's SMs as the profiler
    read them, else the hardware config's), or None."""
    from testbed.sim.costmodel.fit import fa2_shape
    return fa2_shape(spec, cfg.engine, raw["machine"].get("gpu_sms") or dict(cfg.hardware).get("num_sms", 0))


def recorded_limits_and_policy(prof: dict) -> list[str]:
    """The overrides of the deployment limits and the policy a profile was measured with.
    Profiles fitted before the limits left the policy record the policy's knobs in their engine
    section instead: a step held max(max_prefill_tokens, token_budget), the policy was chunked."""
    e = prof["engine"]
    if "max_step_tokens" in e:
        policy = prof["policy"]
        limits = [f"scheduler.max_running={e['max_running']}", f"scheduler.max_step_tokens={e['max_step_tokens']}"]
        return limits + [f"policy={policy['name']}"] + [f"policy.{k}={v}" for k, v in policy.items() if k != "name"]
    return [f"scheduler.max_running={e['max_running']}",
            f"scheduler.max_step_tokens={max(e['max_prefill_tokens'], e['token_budget'])}",
            "policy=chunked", f"policy.token_budget={e['token_budget']}"]


def refit(path: Path, out: Path | None, host_from: list[Path] = (), device_from: list[Path] = (),
          graph_from: list[Path] = (), local_from: list[Path] = (), graph_samples_from: list[Path] = ()) -> int:
    """Fit a stored profile's samples again, with the deployment it records; host_from: more
    profiles of the same deployment whose host workloads join the host fit; device_from: more
    whose device grids are pooled with this one's; graph_from: profiles whose CUDA-graph decode
    shapes replace the grid's (several: pooled among them); local_from: profiles whose mixed
    shapes join the local correction's (with those the profile kept from an earlier refit);
    graph_samples_from: files whose decode-graph samples join the graph fit (with those an earlier
    refit added)."""
    from testbed import assemble
    from testbed.config import compose
    from testbed.sim.costmodel.calibrated import load_profile, write_profile
    from testbed.sim.costmodel.fit import fit_profile, pool_device_samples, report
    try:
        old = load_profile(path.resolve())
        e = old["engine"]
        overrides = ["backend=engine", f"model={old['model']['name']}", f"model.weights={old['model']['weights']}",
                     f"hardware={old['hardware']['name']}"]
        overrides += [f"engine.{k}={e[k]}" for k in ("tp", "page_size", "attention", "kernels", "dtype", "overlap",
                                                     "cuda_graph_max_bs", "prefill_backend")]
        overrides += recorded_limits_and_policy(old)
        overrides.append(f"engine.piecewise_graphs={e.get('piecewise_graphs', False)}")  # older profiles: none
        overrides.append(f"engine.whole_step_graphs={bool(e.get('whole_step_graphs'))}")
        cfg = compose(overrides)
        def same_deployment(p, what):
            other = load_profile(p.resolve())
            if other["model"] != old["model"] or other["engine"]["graph_sizes"] != e["graph_sizes"]:
                raise ValueError(f"{what}={p}: another model or engine settings than {path}")
            return other
        host, starts = [], [old["machine"]]
        for other in [old, *(same_deployment(p, "host_from") for p in host_from)]:
            if other is not old:
                starts.append(other["machine"])
            h = other["samples"]["host"]
            host += [dict(zip(h, v)) for v in zip(*h.values())]
        grids = [old, *(same_deployment(p, "device_from") for p in device_from)]
        device = pool_device_samples([g["samples"]["device"] for g in grids]) if device_from else \
            old["samples"]["device"]
        graph_grids = [same_deployment(p, "graph_from") for p in graph_from]
        if graph_grids and not e["graph_sizes"]:
            raise ValueError(f"graph_from: {path} was profiled without CUDA graphs (engine.cuda_graph_max_bs=0)")
        in_graph = lambda d: d["kind"] == "decode" and d["reqs"] <= max(e["graph_sizes"] or [0])  # noqa: E731

        def samples_of(p: Path, what: str, keep) -> tuple[list[dict], dict]:
            """A local_from / graph_samples_from file's device samples that `keep` takes, each marked
            with the file it came from, and the machine they were measured on."""
            other = local_source(p, what)
            if other["model"] != old["model"] or other["engine"]["graph_sizes"] != e["graph_sizes"]:
                raise ValueError(f"{what}={p}: another model or engine settings than {path}")
            return [d | {"start": p.stem} for d in other["samples"]["device"] if keep(d)], other["machine"]

        if graph_grids:
            # one grid as measured (a grid may time a shape twice: pooling is across starts only)
            theirs = graph_grids[0]["samples"]["device"] if len(graph_grids) == 1 else \
                pool_device_samples([g["samples"]["device"] for g in graph_grids])
            device = [d for d in device if not in_graph(d)] + [d for d in theirs if in_graph(d)]
            grids = graph_grids + grids  # the decode plan: the graph grid's first
        # served graph steps an earlier refit added stay, unless graph_from replaced every graph sample
        served_machines = [] if graph_grids else list(old.get("graph_sample_machines", []))
        for p in graph_samples_from:  # a file's steps once, however often it is named (or an earlier refit took it)
            if p.stem not in {d.get("start") for d in device}:
                got, machine = samples_of(p, "graph_samples_from", in_graph)
                if not got:
                    raise ValueError(f"graph_samples_from={p}: no CUDA-graph decode samples")
                device = device + got
                served_machines.append(machine)
        local, local_machines = list(old["samples"].get("local", [])), list(old.get("local_machines", []))
        for p in local_from:  # a profile's shapes once, however often it is named
            if p.stem not in {d.get("start") for d in local}:
                got, machine = samples_of(p, "local_from", lambda d: d["kind"] == "mixed")
                local += got
                local_machines.append(machine)
        raw = {"device_samples": device, "host_samples": host, "local_samples": local,
               "graph_sizes": e["graph_sizes"], "piece_sizes": old["device"]["eager"].get("piece_sizes", []),
               "num_pages": e["num_pages"], "machine": old["machine"], "timing": old["timing"],
               # the split-KV plan: a property of the GPU and the kernel; older grids did not read it
               "decode_plan": next((g["device"]["graph"]["plan"] for g in grids
                                    if (g["device"]["graph"] or {}).get("plan")), None)}
        spec = assemble.model_spec(cfg)
        dep = deployment(cfg, spec)
        if e.get("whole_step_graphs"):  # the rule it was measured with, not this tree's
            dep["engine"]["whole_step_graphs"] = e["whole_step_graphs"]
        prof = fit_profile(raw, dep, spec, prefill_plan(cfg, spec, raw), name=old["name"])
        prof["fitted_on"] = __import__("datetime").date.today().isoformat()
        if host_from:
            prof["host_machines"] = starts  # the machine starts whose host workloads were fitted
        elif "host_machines" in old:
            prof["host_machines"] = old["host_machines"]
        if device_from:
            prof["device_machines"] = [g["machine"] for g in grids if g not in graph_grids]  # the pooled grids' starts
        elif "device_machines" in old:
            prof["device_machines"] = old["device_machines"]
        if local_machines:
            prof["local_machines"] = local_machines  # the starts whose mixed shapes samples.local holds
        if served_machines:
            prof["graph_sample_machines"] = served_machines  # the starts whose served decode steps the graph fit holds
        if graph_grids:
            prof["graph_machines"] = [g["machine"] for g in graph_grids]  # the decode-graph shapes' starts
        elif "graph_machines" in old:
            prof["graph_machines"] = old["graph_machines"]
    except (ValueError, FileNotFoundError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    written = write_profile(prof, out or path)
    print(report(prof))
    print(f"written {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
