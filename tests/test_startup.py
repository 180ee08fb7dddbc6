"""A simulator run's start-up and end (issue #13): its config composed once, no pandas,
pyarrow.parquet, torch, transformers or scipy imported before the first step, the
one-composition job (testbed/hydra_once.py) leaving what Hydra's own main leaves, and no
pandas for the files at the end either."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("pandas", "pyarrow.parquet", "torch", "transformers", "scipy")

# `python -m testbed.run ARGV` stopped where its first step would run: prints the heavy modules
# imported by then and how often Hydra composed a config
AT_FIRST_STEP = """\
import json, runpy, sys
import hydra._internal.config_loader_impl as loader
import testbed.sim.driver as driver
composed = []
load = loader.ConfigLoaderImpl.load_configuration
def counted(self, *a, **k):
    composed.append(1)
    return load(self, *a, **k)
loader.ConfigLoaderImpl.load_configuration = counted
def first_step(self):
    print(json.dumps({"heavy": [m for m in %r if m in sys.modules], "composed": len(composed)}))
    sys.exit(0)
driver.SimDriver.run = first_step
sys.argv[0] = "testbed.run"
runpy.run_module("testbed.run", run_name="__main__", alter_sys=True)
"""


def at_first_step(tmp_path, *overrides) -> dict:
    p = subprocess.run([sys.executable, "-c", AT_FIRST_STEP % (HEAVY,), *overrides, "progress=false",
                        f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("trace", ["sharegpt", "synthetic"])
def test_a_simulator_run_starts_on_one_composition_without_heavy_imports(tmp_path, trace):
    seen = at_first_step(tmp_path, f"trace={trace}", "trace.num_requests=10")
    assert seen == {"heavy": [], "composed": 1}


def test_a_trace_file_format_that_needs_pandas_still_loads_it(tmp_path):
    assert "pandas" in at_first_step(tmp_path, "trace=azure_conv", "trace.num_requests=10")["heavy"]


def test_the_one_composition_job_leaves_what_hydras_main_leaves(tmp_path):
    args = ["policy=decode_first", "trace.num_requests=20", "trace.rate=8", "progress=false"]
    ours, hydras = tmp_path / "ours", tmp_path / "hydras"
    subprocess.run([sys.executable, "-m", "testbed.run", *args, f"hydra.run.dir={ours}"], cwd=ROOT, check=True,
                   capture_output=True, timeout=120)
    via_main = f"import sys; sys.argv = ['run.py', *{[*args, f'hydra.run.dir={hydras}']!r}]; " \
               "from testbed.run import main; main()"  # Hydra's @hydra.main, composing twice
    subprocess.run([sys.executable, "-c", via_main], cwd=ROOT, check=True, capture_output=True, timeout=120)
    assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in hydras.iterdir())
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        assert (ours / ".hydra" / name).read_text().replace(str(ours), "D") == \
            (hydras / ".hydra" / name).read_text().replace(str(hydras), "D"), name
    for name in ("requests.parquet", "steps.parquet"):
        assert (ours / name).read_bytes() == (hydras / name).read_bytes(), name
    a, b = (json.loads((d / "summary.json").read_text()) for d in (ours, hydras))
    assert a["metrics"] == b["metrics"] and a["config"] == b["config"] and a["versions"] == b["versions"]
    assert "hydra.mode=RUN" in (ours / ".hydra" / "hydra.yaml").read_text()


def test_a_simulator_run_ends_without_pandas_and_still_records_its_version(tmp_path):
    """Its files are built from their buffers (testbed/timeline/arrow_build.py): pyarrow's own
    conversions would import pandas."""
    code = ("import atexit, runpy, sys; atexit.register(lambda: print('pandas loaded:', 'pandas' in sys.modules)); "
            "sys.argv[0] = 'testbed.run'; runpy.run_module('testbed.run', run_name='__main__', alter_sys=True)")
    p = subprocess.run([sys.executable, "-c", code, "trace.num_requests=10", "progress=false",
                        f"hydra.run.dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "pandas loaded: False"
    import pandas
    assert json.loads((tmp_path / "summary.json").read_text())["versions"]["pandas"] == pandas.__version__


@pytest.mark.parametrize("entry", ["testbed.run", "testbed.sim.driver", "testbed.timeline.writer"])
def test_a_run_writes_through_the_system_allocator(entry):
    """However a run's code is first imported, pyarrow comes up on the system allocator (mimalloc
    kept the write's buffers to the process's end), unless the user chose one."""
    code = f"import {entry}, pyarrow as pa; print(pa.default_memory_pool().backend_name)"
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env)
    assert out.stdout.strip() == "system", out.stderr[-500:]
    env["ARROW_DEFAULT_MEMORY_POOL"] = "mimalloc"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env)
    assert out.stdout.strip() == "mimalloc", out.stderr[-500:]
