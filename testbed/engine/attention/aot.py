"""Build flashinfer's attention JIT modules ahead of time on a CPU machine, carry them to the
GPU machine and install them there, so the first call of a wrapper loads a prebuilt ``.so``
instead of compiling for minutes.

flashinfer names each JIT module by a URI made of its template arguments and, before
compiling, looks for ``<package>/data/aot/<uri>/<uri>.so``: whatever is found there is loaded
(and if it does not load, flashinfer falls back to compiling). So the modules are built with
flashinfer's own module specs (``flashinfer.jit.attention.modules.gen_batch_*_module``, the
same calls its wrappers make, so the URIs match) and then copied into that folder::

    # CPU machine, once: a separate venv with flashinfer (and a torch for its import)
    python -m testbed.engine.attention.aot venv                  # -> /tmp/fi_venv
    python -m testbed.engine.attention.aot build --out .fi_aot   # builds in that venv
    # GPU machine, after installing the flashinfer wheel into /tmp/site
    python3 testbed/engine/attention/aot.py install --aot .fi_aot --site /tmp/site

The module set is what :class:`~testbed.engine.attention.flashinfer_backend.FlashInferAttentionBackend`
plans for the models we run (:data:`MODEL_SHAPES`): bf16 q/kv/o, int32 indices, no RoPE in the
kernel, no sliding window, no soft cap; the paged prefill wrapper on the ``fa2`` backend (the
``auto`` backend picks ``fa3``, another module, on an H200), and the decode wrapper's own
module for GQA groups < 4, the (same) fa2 prefill module for groups >= 4 (tensor cores).
The decode wrapper's CUDA-graph mode uses the same modules.

This file only uses the standard library at import time, so it also runs as a plain script
(``python3 path/to/aot.py``) and is importable without torch or flashinfer; the build itself
needs flashinfer and nvcc and runs in the venv's interpreter (a subprocess) when the current
one lacks flashinfer.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLASHINFER_VERSION = "0.6.18.post1"
# The build only needs torch to import flashinfer (the modules are tvm-ffi modules: no torch
# headers, no libtorch link). The CPU wheel is enough once nvidia-cutlass-dsl is removed:
# with it, ``import flashinfer`` queries the GPU at import time and a CPU torch raises.
TORCH_VERSION = "2.13.0"
CUTLASS_DSL_PACKAGES = (
    "nvidia-cutlass-dsl",
    "nvidia-cutlass-dsl-libs-base",
    "nvidia-cutlass-dsl-libs-core",
    "nvidia-cutlass-dsl-libs-cu12",
    "nvidia-cutlass-dsl-libs-cu13",
)
DEFAULT_ARCH = "9.0a"  # H200
DEFAULT_VENV = Path(os.environ.get("FI_AOT_VENV", "/tmp/fi_venv"))
DEFAULT_WORKDIR = Path(os.environ.get("FI_AOT_WORKDIR", "/tmp/fi_aot_work"))
MANIFEST = "manifest.json"

# (num_qo_heads, num_kv_heads, head_dim) of the models the engine runs.
MODEL_SHAPES: dict[str, tuple[int, int, int]] = {
    "Qwen3-0.6B": (16, 8, 128),
    "Llama-3.1-8B": (32, 8, 128),
    "SmolLM2-135M": (9, 3, 64),
}

# flashinfer.jit.utils.filename_safe_dtype_map, for the dtypes we use.
_DTYPE_TAG = {"bfloat16": "bf16", "float16": "f16", "int32": "i32", "int64": "i64"}


@dataclasses.dataclass(frozen=True, order=True)
class ModuleSpec:
    """One flashinfer attention JIT module: ``kind`` 'prefill' (BatchPrefill...Wrapper, and
    tensor-core decode) or 'decode' (BatchDecode...Wrapper without tensor cores)."""

    kind: str
    head_dim: int
    backend: str = "fa2"  # prefill only
    dtype: str = "bfloat16"  # q, kv and o
    idtype: str = "int32"
    pos_encoding_mode: int = 0  # NONE: rope is applied by the model
    use_sliding_window: bool = False
    use_logits_soft_cap: bool = False
    use_fp16_qk_reduction: bool = False  # prefill only

    def __post_init__(self) -> None:
        if self.kind not in ("prefill", "decode"):
            raise ValueError(f"kind must be 'prefill' or 'decode', got {self.kind!r}")
        if self.kind == "prefill" and self.backend not in ("fa2", "fa3"):
            raise ValueError(f"prefill backend must be 'fa2' or 'fa3', got {self.backend!r}")

    @property
    def uri(self) -> str:
        """The module name flashinfer 0.6.18 gives it (``get_batch_{prefill,decode}_uri``)."""
        t, i = _DTYPE_TAG[self.dtype], _DTYPE_TAG[self.idtype]
        common = (
            f"dtype_q_{t}_dtype_kv_{t}_dtype_o_{t}_dtype_idx_{i}_"
            f"head_dim_qk_{self.head_dim}_head_dim_vo_{self.head_dim}_"
            f"posenc_{self.pos_encoding_mode}_use_swa_{self.use_sliding_window}_"
            f"use_logits_cap_{self.use_logits_soft_cap}"
        )
        if self.kind == "decode":
            return f"batch_decode_with_kv_cache_{common}"
        suffix = "_sm90" if self.backend == "fa3" else ""
        return f"batch_prefill_with_kv_cache_{common}_f16qk_{self.use_fp16_qk_reduction}{suffix}"

    def gen_args(self, torch) -> tuple:
        """Arguments of ``gen_batch_{prefill,decode}_module`` (torch passed in, so this module
        imports without it)."""
        dt, it = getattr(torch, self.dtype), getattr(torch, self.idtype)
        head = (dt, dt, dt, it, self.head_dim, self.head_dim, self.pos_encoding_mode,
                self.use_sliding_window, self.use_logits_soft_cap)
        if self.kind == "decode":
            return head
        return (self.backend, *head, self.use_fp16_qk_reduction)


def modules_for_shape(
    num_qo_heads: int, num_kv_heads: int, head_dim: int, decode_use_tensor_cores: bool | None = None,
    backend: str = "fa2",
) -> list[ModuleSpec]:
    """Modules the flashinfer backend plans for one model shape (its default for
    ``decode_use_tensor_cores``: GQA group >= 4) with one prefill template (``engine.prefill_backend``)."""
    if decode_use_tensor_cores is None:
        decode_use_tensor_cores = num_qo_heads // num_kv_heads >= 4
    prefill = ModuleSpec("prefill", head_dim, backend)
    # tensor-core decode always runs the fa2 prefill template (flashinfer_backend.py says why)
    decode = ModuleSpec("prefill", head_dim) if decode_use_tensor_cores else ModuleSpec("decode", head_dim)
    return sorted({prefill, decode})


def default_specs(shapes: dict[str, tuple[int, int, int]] | None = None,
                  backends: tuple[str, ...] = ("fa2",)) -> list[ModuleSpec]:
    """The union over :data:`MODEL_SHAPES` (or ``shapes``) and the kernel templates."""
    out: set[ModuleSpec] = set()
    for q, kv, hd in (shapes or MODEL_SHAPES).values():
        for b in backends:
            out.update(modules_for_shape(q, kv, hd, backend=b))
    return sorted(out)


# ----------------------------------------------------------------------------- install


def flashinfer_dir(site: Path | None) -> Path:
    """The installed flashinfer package folder: ``site/flashinfer`` or, without ``site``,
    where the current interpreter finds it (not imported)."""
    if site is not None:
        pkg = Path(site) / "flashinfer"
        if not (pkg / "__init__.py").is_file():
            raise FileNotFoundError(f"no flashinfer package under {site}")
        return pkg
    found = importlib.util.find_spec("flashinfer")
    if found is None or not found.submodule_search_locations:
        raise FileNotFoundError("flashinfer is not importable here; pass --site")
    return Path(list(found.submodule_search_locations)[0])


def installed_version(pkg: Path) -> str | None:
    """flashinfer's version from the dist-info next to the package (None if not found)."""
    for dist in pkg.parent.glob("flashinfer_python-*.dist-info"):
        return dist.name[len("flashinfer_python-"): -len(".dist-info")]
    return None


def built_modules(aot: Path) -> list[str]:
    """Module folders in a build output: ``<aot>/<name>/<name>.so``."""
    aot = Path(aot)
    if not aot.is_dir():
        return []
    return sorted(d.name for d in aot.iterdir() if d.is_dir() and (d / f"{d.name}.so").is_file())


def install(aot: Path, site: Path | None = None, force: bool = False, log=print) -> list[Path]:
    """Copy every built module folder of ``aot`` into the installed flashinfer's ``data/aot/``
    (replacing one of the same name). Refuses a build made for another flashinfer version
    (the manifest says which) unless ``force``. Returns the installed folders."""
    aot = Path(aot)
    names = built_modules(aot)
    if not names:
        raise FileNotFoundError(f"no built modules (<name>/<name>.so) under {aot}")
    pkg = flashinfer_dir(site)
    manifest = _read_manifest(aot)
    have, built_for = installed_version(pkg), manifest.get("flashinfer_version")
    if have and built_for and have != built_for and not force:
        raise RuntimeError(
            f"modules in {aot} were built for flashinfer {built_for}, installed is {have} "
            "(module ABI may differ); rebuild, or pass --force"
        )
    dest_root = pkg / "data" / "aot"
    dest_root.mkdir(parents=True, exist_ok=True)
    done = []
    for name in names:
        dest = dest_root / name
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(aot / name, dest)
        done.append(dest)
    size = sum(f.stat().st_size for d in done for f in d.rglob("*") if f.is_file())
    log(f"installed {len(done)} flashinfer modules ({size / 2**20:.1f} MiB) into {dest_root}")
    return done


def _read_manifest(aot: Path) -> dict:
    path = Path(aot) / MANIFEST
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


# ----------------------------------------------------------------------------- build


def make_libcuda_stub(folder: Path) -> Path:
    """An empty ``libcuda.so`` (soname ``libcuda.so.1``, the driver's) for the link step's
    ``-lcuda`` on a machine without the driver; the real one is loaded on the GPU machine."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lib = folder / "libcuda.so"
    if not lib.is_file():
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "stub.c"
            src.write_text("/* empty stub of the CUDA driver library, for linking only */\n")
            subprocess.run(
                ["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(lib), str(src)],
                check=True,
            )
    so1 = folder / "libcuda.so.1"
    if not so1.exists():
        so1.symlink_to("libcuda.so")
    return lib


def find_cuda_home() -> str:
    """CUDA_HOME, else the toolkit behind ``nvcc`` (resolving wrapper scripts such as
    /usr/local/bin/nvcc, which flashinfer would take for a toolkit at /usr/local)."""
    env = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if env:
        return env
    for cand in ("/usr/local/cuda",):
        if Path(cand, "bin", "nvcc").is_file():
            return cand
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("nvcc not found: install the CUDA toolkit or set CUDA_HOME")
    return str(Path(nvcc).resolve().parent.parent)


def _build_env(workdir: Path, arch: str, jobs: int | None) -> dict[str, str]:
    """Environment for flashinfer's JIT: must be in place before flashinfer is imported."""
    stub = make_libcuda_stub(Path(workdir) / "libcuda_stub").parent
    env = {
        "FLASHINFER_CUDA_ARCH_LIST": arch,
        "FLASHINFER_WORKSPACE_BASE": str(Path(workdir).resolve()),
        "CUDA_HOME": find_cuda_home(),
        "LIBRARY_PATH": os.pathsep.join(p for p in (str(stub), os.environ.get("LIBRARY_PATH", "")) if p),
    }
    if jobs:
        env["MAX_JOBS"] = str(jobs)
    return env


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks (also used by testbed.engine.convert)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _needed_libs(so: Path) -> list[str]:
    try:
        out = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True).stdout
    except OSError:
        return []
    return [line.split("[", 1)[1].rstrip("]").strip() for line in out.splitlines() if "(NEEDED)" in line]


def build_in_process(
    specs: list[ModuleSpec], out: Path, workdir: Path, arch: str = DEFAULT_ARCH,
    jobs: int | None = None, force: bool = False, log=print,
) -> dict:
    """Build ``specs`` with the flashinfer importable here and put each ``<uri>.so`` in
    ``out/<uri>/``; writes ``out/manifest.json``. Needs flashinfer, nvcc, gcc and ninja."""
    os.environ.update(_build_env(workdir, arch, jobs))
    if "flashinfer" in sys.modules:
        raise RuntimeError("flashinfer was imported before its build environment was set")
    import torch
    import flashinfer
    from flashinfer.jit.attention import modules as fim

    if flashinfer.__version__ != FLASHINFER_VERSION:
        log(f"warning: flashinfer {flashinfer.__version__} here, the GPU machine has {FLASHINFER_VERSION}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    manifest = _read_manifest(out)
    if manifest.get("flashinfer_version") not in (None, flashinfer.__version__) or manifest.get("arch") not in (None, arch):
        manifest = {}  # built for something else: its entries are stale
    entries = {m["uri"]: m for m in manifest.get("modules", [])}
    for spec in specs:
        gen = fim.gen_batch_prefill_module if spec.kind == "prefill" else fim.gen_batch_decode_module
        jit = gen(*spec.gen_args(torch))
        if jit.name != spec.uri:
            raise RuntimeError(f"flashinfer names {spec} {jit.name!r}, expected {spec.uri!r}")
        dest = out / spec.uri / f"{spec.uri}.so"
        if dest.is_file() and spec.uri in entries and not force:
            log(f"[aot] up to date: {spec.uri}")
            continue
        log(f"[aot] building {spec.kind} head_dim={spec.head_dim} backend={spec.backend}: {spec.uri}")
        t0 = time.time()
        jit.build(verbose=False)
        seconds = time.time() - t0
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(jit.jit_library_path, dest)
        entries[spec.uri] = {
            "uri": spec.uri,
            "spec": dataclasses.asdict(spec),
            "bytes": dest.stat().st_size,
            "sha256": file_sha256(dest),
            "build_seconds": round(seconds, 1),
            "needed": _needed_libs(dest),
        }
        log(f"[aot] built in {seconds:.0f} s, {dest.stat().st_size / 2**20:.2f} MiB")
        _write_manifest(out, flashinfer.__version__, arch, entries)
    return _write_manifest(out, flashinfer.__version__, arch, entries)


def _write_manifest(out: Path, version: str, arch: str, entries: dict) -> dict:
    manifest = {
        "flashinfer_version": version,
        "arch": arch,
        "modules": [entries[k] for k in sorted(entries)],
        "total_bytes": sum(e["bytes"] for e in entries.values()),
    }
    (Path(out) / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def has_flashinfer() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


def venv_python(venv: Path) -> Path:
    return Path(venv) / "bin" / "python"


def make_venv(venv: Path = DEFAULT_VENV, python: str | None = None, log=print) -> Path:
    """A venv with flashinfer (and CPU torch, for its import) for building; leaves the
    project's venv alone. Removes nvidia-cutlass-dsl (see :data:`TORCH_VERSION`)."""
    venv = Path(venv)
    py = venv_python(venv)
    if not py.is_file():
        subprocess.run([python or sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(py), "-m", "pip", "install", "-q"]
    subprocess.run(pip + [f"torch=={TORCH_VERSION}", f"flashinfer-python=={FLASHINFER_VERSION}"], check=True)
    subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "-q", *CUTLASS_DSL_PACKAGES], check=True)
    log(f"flashinfer {FLASHINFER_VERSION} build venv ready: {py}")
    return py


def select_specs(only: list[str] | None, backends: tuple[str, ...] = ("fa2",)) -> list[ModuleSpec]:
    specs = default_specs(backends=backends)
    if not only:
        return specs
    chosen = [s for s in specs if any(o in s.uri or o == f"{s.kind}{s.head_dim}" for o in only)]
    if not chosen:
        raise ValueError(f"--only {only} matches none of: {[f'{s.kind}{s.head_dim}' for s in specs]}")
    return chosen


# ----------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m testbed.engine.attention.aot", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    sub.add_parser("list", help="print the module specs and their flashinfer URIs")

    p = sub.add_parser("venv", help=f"make the build venv (flashinfer {FLASHINFER_VERSION}, CPU torch)")
    p.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    p.add_argument("--python", default=None, help="interpreter for the venv (default: this one)")

    p = sub.add_parser("build", help="build the modules into --out")
    p.add_argument("--out", type=Path, default=Path(".fi_aot"))
    p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="flashinfer's JIT workspace (objects, sources)")
    p.add_argument("--arch", default=DEFAULT_ARCH, help="FLASHINFER_CUDA_ARCH_LIST")
    p.add_argument("--jobs", type=int, default=None, help="parallel nvcc jobs (MAX_JOBS; default: ninja's)")
    p.add_argument("--only", nargs="*", default=None, help="e.g. prefill128 decode64, or part of a URI")
    p.add_argument("--backends", nargs="+", default=["fa2"], choices=["fa2", "fa3"],
                   help="prefill templates (engine.prefill_backend); fa3 needs curand headers on CPATH")
    p.add_argument("--force", action="store_true", help="rebuild modules already in --out")
    p.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="used when flashinfer is not importable here")
    p.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)

    p = sub.add_parser("install", help="copy built modules into an installed flashinfer's data/aot/")
    p.add_argument("--aot", type=Path, default=Path(".fi_aot"))
    p.add_argument("--site", type=Path, default=None, help="folder holding the flashinfer package (default: where it imports from)")
    p.add_argument("--force", action="store_true", help="install even if built for another flashinfer version")

    args = ap.parse_args(argv)
    if args.cmd == "list":
        for s in default_specs():
            print(f"{s.kind:7s} head_dim={s.head_dim:<4d} backend={s.backend}  {s.uri}")
        return 0
    if args.cmd == "venv":
        make_venv(args.venv, args.python)
        return 0
    if args.cmd == "install":
        try:
            install(args.aot, args.site, force=args.force)
        except (FileNotFoundError, RuntimeError) as e:  # nothing built there, another version, no flashinfer
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    # build
    specs = select_specs(args.only, tuple(args.backends))
    if args.in_process or has_flashinfer():
        manifest = build_in_process(specs, args.out, args.workdir, args.arch, args.jobs, args.force)
        total = manifest["total_bytes"]
        print(f"[aot] {len(manifest['modules'])} modules in {args.out}, {total / 2**20:.1f} MiB")
        return 0
    py = venv_python(args.venv)
    if not py.is_file():
        print(f"flashinfer is not importable here and {py} is missing: run "
              f"`python -m testbed.engine.attention.aot venv --venv {args.venv}` first", file=sys.stderr)
        return 2
    # -P: keep this file's folder off sys.path (its modules would shadow nothing today, but
    # the worker should see only the venv's packages).
    cmd = [str(py), "-P", str(Path(__file__).resolve()), "build", "--in-process",
           "--out", str(args.out.resolve()), "--workdir", str(args.workdir.resolve()), "--arch", args.arch]
    if args.jobs:
        cmd += ["--jobs", str(args.jobs)]
    if args.only:
        cmd += ["--only", *args.only]
    cmd += ["--backends", *args.backends]
    if args.force:
        cmd.append("--force")
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
