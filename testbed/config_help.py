"""`python -m testbed.run --help`: the groups and every knob with its default and a line of help.

The help is the comment beside each field of the config dataclasses (testbed/config.py, the
scheduler's, the policies', the trace's and the model's), or the comment lines right above it:
the schema and its documentation stay in one place."""
from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from pathlib import Path

CONF = Path(__file__).resolve().parents[1] / "conf"
_FIELD = re.compile(r"^\s+(\w+)\s*:\s*[^#=]+(?:=[^#]*)?(?:#\s*(.*))?$")


def _docs(cls) -> dict[str, str]:
    """field name -> its comment (beside it, else the comment lines just above it)."""
    docs: dict[str, str] = {}
    above: list[str] = []
    for line in inspect.getsource(cls).splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# ").strip())
            continue
        m = _FIELD.match(line)
        if m and not stripped.startswith(("def ", "return", "@")):
            docs.setdefault(m.group(1), m.group(2) or " ".join(above))
        above = []
    return {k: v for k, v in docs.items() if v}


def knobs(cls=None, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, help) of every setting under a config dataclass (Config by default); the
    defaults shown are the composed config's (_defaults), not the dataclasses' placeholders."""
    if cls is None:
        from testbed.config import Config
        cls = Config
    from policies import PolicyConfig
    from testbed.config import BackendConfig
    hints, docs, out = typing.get_type_hints(cls), _docs(cls), []
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            out += knobs(t, f"{prefix}{f.name}.")
            if t is PolicyConfig:
                out += policy_knobs(f"{prefix}{f.name}.")
            if t is BackendConfig:
                out += backend_knobs(f"{prefix}{f.name}.")
        elif t is not typing.Any:  # Any: a group's own yaml (hardware, costmodel)
            out.append((prefix + f.name, docs.get(f.name, "")))
    return out


def policy_knobs(prefix: str = "policy.") -> list[tuple[str, str]]:
    """(dotted key, help) of the knobs policies have of their own (their Config subclasses): which
    policies have each, with its default there and its comment; no help if a comment is missing."""
    from policies import POLICIES, own_knobs
    by_knob: dict[str, list[str | None]] = {}
    for name in POLICIES.names():
        cls = POLICIES.get(name).config
        docs, defaults = _docs(cls), {f.name: f.default for f in dataclasses.fields(cls)}
        for k in own_knobs(cls):
            by_knob.setdefault(k, []).append(f"policy={name} ({defaults[k]}): {docs[k]}" if k in docs else None)
    return [(prefix + k, "" if None in v else "; ".join(v)) for k, v in sorted(by_knob.items())]


def backend_knobs(prefix: str = "backend.") -> list[tuple[str, str]]:
    """(dotted key, help) of each backend's own settings (backend=sim's, backend=http's), with
    their defaults there."""
    from testbed.config import BackendConfig, HttpBackendConfig, SimBackendConfig
    base, out = {f.name for f in dataclasses.fields(BackendConfig)}, []
    for name, cls in (("sim", SimBackendConfig), ("http", HttpBackendConfig)):
        docs = _docs(cls)
        out += [(prefix + f.name, f"backend={name} ({'null' if f.default is None else str(f.default).lower()}): "
                 f"{docs.get(f.name, '')}") for f in dataclasses.fields(cls) if f.name not in base]
    return out


def _defaults(keys) -> dict[str, object]:
    """Each key's value in the config `python -m testbed.run` composes with no overrides."""
    from omegaconf import OmegaConf

    from testbed.config import compose_raw
    cfg = compose_raw([])
    return {k: OmegaConf.select(cfg, k, throw_on_resolution_failure=False) for k in keys}


def groups() -> dict[str, list[str]]:
    """conf/<group>/*.yaml option names per group (the registries add policy modules too)."""
    from policies import EVICTIONS, POLICIES
    from testbed.kv import PREFIX_CACHES
    out = {d.name: sorted(p.stem for p in d.glob("*.yaml")) for d in sorted(CONF.iterdir())
           if d.is_dir() and d.name not in ("hydra", "sweep")}
    for group, registry in (("policy", POLICIES), ("eviction", EVICTIONS), ("cache", PREFIX_CACHES)):
        out[group] = sorted(set(out.get(group, [])) | set(registry.names()))
    out["sweep"] = sorted(p.stem for p in (CONF / "sweep").glob("*.yaml"))  # +sweep=NAME: a ready-made multirun
    return out


def render() -> str:
    lines = ["python -m testbed.run [group=option ...] [key=value ...]   (Hydra overrides; -m: a multirun)",
             "", "Groups (group=option):"]
    for g, names in groups().items():
        lines.append(f"  {'+sweep' if g == 'sweep' else g:<10} {', '.join(names)}")
    lines += ["", "Settings (key=value) and their defaults (hardware.* and costmodel.* are their group's yaml, "
              "conf/hardware and conf/costmodel):"]
    rows = knobs()
    defaults = _defaults([k for k, _ in rows])
    by_policy = {k for k, _ in policy_knobs() + backend_knobs()}  # their defaults are in the help: a policy's, a backend's
    width = max(len(k) for k, _ in rows)
    for key, doc in rows:
        v = defaults[key]
        shown = "-" if key in by_policy else "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
        lines.append(f"  {key:<{width}}  {shown:<12} {doc}")
    lines += ["", "Hydra's own: --cfg job (the composed config), --info, --hydra-help."]
    return "\n".join(lines)
