"""What every serving process does around its work: its log lines name it, Ctrl-C is left to
the launcher (which shuts the processes down in order), and it says when it is ready, or
why it could not start, on its pipe to the launcher."""
from __future__ import annotations

import logging
import signal
import sys
import traceback

LOG_FORMAT = "%(asctime)s [%(processName)s] %(levelname)s %(message)s"


def exit_with_parent() -> None:
    """A thread that ends this process when its launcher is gone (killed: no shutdown came)."""
    import os
    import threading
    import time
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def worker_main(name: str, conn, run, *args, with_parent: bool = True) -> None:
    """Run `run(*args, ready)` in this process; `ready()` tells the launcher it is up.
    with_parent: exit at once if the launcher is gone (the scheduler sees to that itself, to
    write its run first)."""
    import multiprocessing
    multiprocessing.current_process().name = name
    if with_parent:
        exit_with_parent()
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, force=True)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    started = False

    def ready() -> None:
        nonlocal started
        started = True
        conn.send(("ready", name))
    try:
        run(*args, ready)
    except Exception as e:
        line = f"{type(e).__name__}: {e}"
        if not started:  # the launcher reports it as the reason the server did not start
            conn.send(("error", line))
        else:
            logging.getLogger(name).error("%s\n%s", line, traceback.format_exc())
        sys.exit(1)
