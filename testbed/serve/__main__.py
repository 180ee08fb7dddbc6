"""`python -m testbed.serve model=... model.path=DIR [policy=...] [engine.*=...] [serve.port=...]`:
serve the model over HTTP (OpenAI-compatible) with the engine of `testbed.run backend=engine`,
configured by the same Hydra groups (conf/serve.yaml: conf/config.yaml on the engine). On
Ctrl-C / SIGTERM it writes requests.parquet, steps.parquet and summary.json of what was
served into Hydra's run directory."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra

from testbed.config import ConfigError, check, register_schema, to_config
from testbed.serve.process import LOG_FORMAT

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
register_schema()


def tokenizer_dir(cfg) -> str:
    d = cfg.serve.tokenizer or cfg.model.path
    if not d:
        raise ConfigError("serving needs a tokenizer: model.path=DIR (a model directory with its tokenizer), "
                          "or serve.tokenizer=DIR with model.weights=dummy")
    if not (Path(d) / "tokenizer.json").is_file() and not (Path(d) / "tokenizer_config.json").is_file():
        raise ConfigError(f"serve.tokenizer={d!r} holds no tokenizer (tokenizer.json / tokenizer_config.json)")
    return d


def task(dcfg) -> None:
    from hydra.core.hydra_config import HydraConfig

    from testbed import assemble
    from testbed.run import Terminated
    from testbed.serve.launcher import StartError, serve
    from testbed.timeline.rundir import claim_run_dir
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, force=True)
    out_dir = HydraConfig.get().runtime.output_dir
    try:
        cfg = to_config(dcfg)
        check(cfg)
        if cfg.backend.name != "engine":
            raise ConfigError(f"backend={cfg.backend.name!r} is invalid for serving; allowed: engine")
        tok = tokenizer_dir(cfg)
        spec = assemble.model_spec(cfg)
        lock = claim_run_dir(out_dir)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    try:
        code = serve(cfg, out_dir, tok, spec)
    except StartError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except (KeyboardInterrupt, Terminated):
        print("stopped while starting; nothing was written", file=sys.stderr)
        sys.exit(130)
    finally:
        lock.close()
    sys.exit(code)


main = hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="serve")(task)


if __name__ == "__main__":
    if {"--help", "-h"} & set(sys.argv[1:]):
        from testbed.config_help import render
        print(render())
        sys.exit(0)
    from testbed import hydra_once
    # one composition, the run directory claimed before Hydra writes there: a server refused a
    # directory another run holds writes nothing in it
    if not hydra_once.run_if_plain(task, CONF_DIR, "serve", sys.argv[1:]):
        main()
