"""A run directory holds one run: a run locks its directory for as long as it runs, and a run
into a directory that is locked, or that already holds a run's files, fails at start (two
runs writing one directory mixed or broke each other's files). A plain run claims it before
Hydra writes its .hydra files there (hold_run_dir), so a refused run changes nothing."""
from __future__ import annotations

import os
from pathlib import Path

RUN_FILES = ("requests.parquet", "steps.parquet", "summary.json")
LOCK_NAME = ".testbed.lock"
_held: dict[str, object] = {}  # claimed ahead of the run (hold_run_dir), by absolute path


def hold_run_dir(out_dir: str | os.PathLike) -> None:
    """Claim `out_dir` before Hydra writes its .hydra files and run.log there (testbed.hydra_once):
    a run refused afterwards had already overwritten the other run's record of its config. The
    run's own claim_run_dir takes this claim over; release_held_run_dir drops one not taken."""
    _held[os.path.abspath(out_dir)] = claim_run_dir(os.path.abspath(out_dir))


def release_held_run_dir(out_dir: str | os.PathLike) -> None:
    f = _held.pop(os.path.abspath(out_dir), None)
    if f is not None:
        f.close()


class RunDirError(ValueError):
    pass


def claim_run_dir(out_dir: str | os.PathLike):
    """Lock `out_dir` for this process (the lock goes with the process, however it ends);
    returns the open lock file, to close when the run is written. RunDirError, in one line,
    when another run holds it or it already holds a run."""
    held = _held.pop(os.path.abspath(out_dir), None)
    if held is not None:  # this process claimed it before Hydra wrote there
        return held
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
                              f"hydra.run.dir (a sweep: hydra.sweep.dir)") from None
    held = [n for n in RUN_FILES if (out / n).exists()]
    if held:
        f.close()
        raise RunDirError(f"run directory {out} already holds a run ({', '.join(held)}); give this one its own "
                          f"hydra.run.dir (a sweep: hydra.sweep.dir), or remove those files")
    return f
