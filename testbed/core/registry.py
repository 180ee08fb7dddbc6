"""Named choices of one pluggable part (policies, eviction orders, prefix caches, traces,
cost models, attention backends, kernels): the one way every part is found by name.

    POLICIES = Registry("policy.name", package="policies.scheduling", pick=one_policy_class)
    COST_MODELS = Registry("costmodel.name", modules={"roofline": "testbed.sim.costmodel.roofline"})

    @COST_MODELS.register("roofline", config=RooflineConfig)   # in the module that owns it
    def make_roofline(spec, hardware, cfg): ...

    COST_MODELS.names()            # every name, without importing the modules that own them
    COST_MODELS.check("nope")      # ValueError: costmodel.name='nope' is unknown; allowed: ...
    entry = COST_MODELS.get("roofline")   # imports the owning module; entry.obj, entry.config

A name is owned by one module: registered where it is defined, or listed in `modules` (the
module registers it when imported), or a module of `package` (its name is the module's
name; `pick(module)` is the object). Owning modules are imported only when a name is looked
up, so listing and checking names stays cheap and never imports torch."""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any, Callable, Iterable, Mapping


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    obj: Any
    config: type | None = None  # the dataclass this choice's settings are read into


class Registry:
    def __init__(self, key: str, *, modules: Mapping[str, str] | None = None, package: str | None = None,
                 pick: Callable[[Any], Any] | None = None, config_of: Callable[[Any], type] | None = None,
                 error: type[Exception] = ValueError):
        """key: the config key the name comes from, for messages (e.g. "policy.name");
        pick / config_of: a package module's object, and that object's config dataclass;
        error: the exception type the part raises for bad input (a ValueError)."""
        if (package is None) != (pick is None):
            raise TypeError("a package registry needs both package and pick")
        self.key = key
        self._entries: dict[str, Entry] = {}
        self._modules = dict(modules or {})
        self._package, self._pick, self._config_of = package, pick, config_of
        self._error = error

    def register(self, name: str, obj: Any = None, *, config: type | None = None):
        """Register `obj` under `name`; without `obj`, a decorator."""
        if obj is None:
            return lambda o: self.register(name, o, config=config)
        old = self._entries.get(name)
        if old is not None and old.obj is not obj:
            raise ValueError(f"{self.key}={name!r} is registered twice ({old.obj!r} and {obj!r})")
        self._entries[name] = Entry(name, obj, config)
        return obj

    def _package_names(self) -> list[str]:
        if self._package is None:
            return []
        pkg = importlib.import_module(self._package)
        return [m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_")]

    def names(self) -> list[str]:
        return sorted({*self._entries, *self._modules, *self._package_names()})

    def check(self, name: Any, also: Iterable[str] = ()) -> None:
        """Raise the one-line error unless `name` is a registered name (or one of `also`:
        names the owner resolves itself, e.g. engine.kernels=auto)."""
        also = tuple(also)
        if name in also or (isinstance(name, str) and name in self.names()):
            return
        raise self._error(f"{self.key}={name!r} is unknown; allowed: {', '.join(sorted([*also, *self.names()]))}")

    def get(self, name: str) -> Entry:
        if name not in self._entries:
            self.check(name)
            owner = self._modules.get(name) or f"{self._package}.{name}"
            module = importlib.import_module(owner)
            if name not in self._entries and self._package is not None and name not in self._modules:
                obj = self._pick(module)
                self.register(name, obj, config=self._config_of(obj) if self._config_of else None)
            if name not in self._entries:
                raise TypeError(f"{owner} was to register {self.key}={name!r} and did not")
        return self._entries[name]


def read_config(config_cls: type, raw: Any, prefix: str) -> Any:
    """A choice's settings as its config dataclass, from None (the defaults), an instance or a
    mapping (a `name` key is dropped: Hydra's group node carries one; an OmegaConf node is
    resolved by the caller); unknown keys fail naming the allowed ones. `prefix` names the
    config node in errors."""
    if raw is None:
        return config_cls()
    if isinstance(raw, config_cls):
        return raw
    if not isinstance(raw, Mapping):
        raise ValueError(f"{prefix}: expected a mapping or {config_cls.__name__}, got {type(raw).__name__}")
    allowed = [f.name for f in dataclasses.fields(config_cls)]
    kwargs = {k: v for k, v in raw.items() if k != "name"}
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ValueError(f"{prefix}: unknown key(s) {unknown}; allowed: {allowed}")
    return config_cls(**kwargs)
