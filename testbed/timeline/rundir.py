"""A run directory holds one run: a run locks its directory for as long as it runs, and a run
into a directory that is locked, or that already holds a run's files, fails at start (two
runs writing one directory mixed or broke each other's files)."""
from __future__ import annotations

import os
from pathlib import Path

RUN_FILES = ("requests.parquet", "steps.parquet", "summary.json")
LOCK_NAME = ".testbed.lock"


class RunDirError(ValueError):
    pass


def claim_run_dir(out_dir: str | os.PathLike):
    """Lock `out_dir` for this process (the lock goes with the process, however it ends);
    returns the open lock file, to close when the run is written. RunDirError, in one line,
    when another run holds it or it already holds a run."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    f = open(out / LOCK_NAME, "a")
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, the files check still applies
        fcntl = None
    if fcntl is not None:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            raise RunDirError(f"run directory {out} is in use by another run; give this one its own "
                              f"hydra.run.dir") from None
    held = [n for n in RUN_FILES if (out / n).exists()]
    if held:
        f.close()
        raise RunDirError(f"run directory {out} already holds a run ({', '.join(held)}); give this one its own "
                          f"hydra.run.dir, or remove those files")
    return f
