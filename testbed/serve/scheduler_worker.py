"""The scheduler + engine process: the replay's engine run (testbed.assemble, the step loop,
testbed.run.drive's end of run) with a MessageFeed in place of the trace. It ends on a
Shutdown message (or its launcher gone): every request still there is aborted, the steps in
flight finish, and requests.parquet / steps.parquet / summary.json of what was served are
written into the run directory."""
from __future__ import annotations

import dataclasses
import sys

import zmq

from testbed.serve.channels import Channels, pull, push
from testbed.serve.process import worker_main


def run(cfg, ch: Channels, out_dir: str, ready) -> None:
    from testbed import assemble
    from testbed.run import Terminated, drive
    from testbed.serve.feed import MessageFeed, ServingDriver
    cfg = dataclasses.replace(cfg, progress=False)  # a server has no total to count towards
    spec = assemble.model_spec(cfg)
    ctx = zmq.Context()
    feed = MessageFeed(pull(ctx, ch.scheduler), push(ctx, ch.detokenizer), spec.eos_token_ids,
                       cfg.serve.idle_kv_check)
    built = assemble.build_server_run(cfg, spec, feed, ServingDriver)
    built.driver.start_clock()  # before any request can come: none arrives before t=0
    ready()
    try:
        drive(cfg, out_dir, built, keep_ids=True)
    except Terminated:  # killed by SIGTERM: what was served is written (complete: false)
        sys.exit(143)


def main(cfg, ch: Channels, out_dir: str, conn) -> None:
    worker_main("scheduler", conn, run, cfg, ch, out_dir, with_parent=False)
