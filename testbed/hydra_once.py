"""A plain run's Hydra job with its config composed once. @hydra.main composes a run's config
twice (to read hydra.mode, then to run it) and testbed.run's precheck a third time, ~0.1 s
each of a simulator run's start-up. For a command line of overrides only, one composition
serves all three: a failure goes to testbed.run's precheck and Hydra's own main, which report
it as before; the config's hydra.mode is read from it; and the job runs on it as Hydra.run
runs one (the same run directory and .hydra files, callbacks and logging: tests/test_startup.py
compares them with Hydra's), its run directory claimed first (testbed.timeline.rundir), so a run
refused there writes nothing, not even Hydra's files."""
from __future__ import annotations

import sys

from hydra._internal.callbacks import Callbacks
from hydra._internal.hydra import Hydra
from hydra._internal.utils import (create_automatic_config_search_path,
                                   detect_calling_file_or_module_from_task_function, detect_task_name, run_and_report)
from hydra.core.global_hydra import GlobalHydra
from hydra.core.utils import run_job
from hydra.types import HydraContext, RunMode
from omegaconf import OmegaConf, read_write

from testbed.timeline.rundir import RunDirError, hold_run_dir, release_held_run_dir


class NotComposed(Exception):
    """The overrides did not compose; Hydra's error is the cause."""


def run_if_plain(task, config_dir: str, config_name: str, argv: list[str]) -> bool:
    """run() for a command line of overrides only; False, with nothing run, for one with flags
    (-m, --cfg ...), a multirun's config or overrides that do not compose: the caller's Hydra
    main runs or reports those as before."""
    if any(a.startswith("-") for a in argv):
        return False
    try:
        return run(task, config_dir, config_name, argv)
    except NotComposed:
        return False


def run(task, config_dir: str, config_name: str, overrides: list[str]) -> bool:
    """Run `task` (the function @hydra.main decorates) on OVERRIDES as `@hydra.main` would run
    it from the command line. False, with nothing run, when the config asks for a multirun
    (hydra.mode=MULTIRUN): Hydra's main runs that. NotComposed when the overrides do not compose."""
    calling_file, calling_module = detect_calling_file_or_module_from_task_function(task)
    search_path = create_automatic_config_search_path(calling_file, calling_module, config_dir)
    hydra = run_and_report(lambda: Hydra.create_main_hydra2(task_name=detect_task_name(calling_file, calling_module),
                                                            config_search_path=search_path))
    try:
        try:
            cfg = hydra.compose_config(config_name, list(overrides), run_mode=RunMode.RUN, with_log_configuration=True)
        except Exception as e:  # whatever Hydra raises composing: its main's and precheck's to report
            raise NotComposed(str(e)) from e
        if cfg.hydra.mode == RunMode.MULTIRUN:
            return False
        if cfg.hydra.mode is None:  # Hydra's main adds the override hydra.mode=RUN and composes again: its effect
            cfg.hydra.mode = RunMode.RUN
            cfg.hydra.overrides.hydra.append("hydra.mode=RUN")
        # the run directory, resolved once (Hydra would resolve ${now:...} again), claimed before
        # Hydra writes its files there: a refused run must not overwrite another's .hydra record
        out = str(OmegaConf.select(cfg, "hydra.run.dir"))
        with read_write(cfg.hydra.run):
            cfg.hydra.run.dir = out
        try:
            hold_run_dir(out)
        except RunDirError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        try:
            run_and_report(lambda: _run_job(hydra, task, cfg, config_name))
        finally:
            release_held_run_dir(out)  # where the run did not take it (an error before it started)
        return True
    finally:
        GlobalHydra.instance().clear()


def _run_job(hydra: Hydra, task, cfg, config_name: str) -> None:
    """Hydra.run after its composition."""
    callbacks = Callbacks(cfg)
    callbacks.on_run_start(config=cfg, config_name=config_name)
    ret = run_job(hydra_context=HydraContext(config_loader=hydra.config_loader, callbacks=callbacks),
                  task_function=task, config=cfg, job_dir_key="hydra.run.dir", job_subdir_key=None,
                  configure_logging=True)
    callbacks.on_run_end(config=cfg, config_name=config_name, job_return=ret)
    _ = ret.return_value  # raises the task's exception, as Hydra.run does
