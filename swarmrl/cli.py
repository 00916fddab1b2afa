"""`swarmrl` command line: one verb per job, each verb's module parses its own flags (`VERB --help`).

swarmrl up                 run the whole swarm on this machine (NATS, engine, gateway, merger,
                           trainer, ledger, example clients) and train the default task
swarmrl down               stop a running `swarmrl up` (the latest run, --run-dir, or $SWARMRL_NATS's swarm)
swarmrl status             what a running swarm is doing (processes, restarts, steps, eval, clients)
swarmrl clients restart TASK   replace a task's client processes in a running swarm (live code iteration)
swarmrl credentials mint NAME  give an agent client its own NATS identity (revoke, list: also live)
swarmrl serve NAME         run one service alone (gateway, engine, merger, trainer, ledger, tracker,
                           actions, action-worker); `--config swarm.toml [--model M]` configures it as `up` would
swarmrl setup              create the streams and buckets on NATS servers you run yourself (`up` does it itself)
swarmrl query "SQL"        query a run's ledger with DuckDB (default: the latest run; --remote: over NATS)
swarmrl export RUN --model M --to DIR   a run's trained model as an HF model directory
swarmrl research STUDY.toml    run a study (arms x seeds of swarm runs), resumable; statistics and a report
swarmrl bootstrap-model    build the tiny offline model used on CPU
swarmrl nats               run the embedded NATS server alone (prints its URL and an agent connect file)
"""

from __future__ import annotations

import importlib
import re
import sys
from typing import Any

SERVICES = ("gateway", "engine", "merger", "trainer", "ledger", "tracker", "actions", "action-worker")
SERVE_ENTRIES = {"action-worker": ("swarmrl.services.actions.main", "worker_main")}
"""Service -> (module, entry) where it is not swarmrl.services.<name>.main:main."""
VERBS = {
    "up": ("swarmrl.up", "main"),
    "down": ("swarmrl.clients", "down"),
    "clients": ("swarmrl.clients", "main"),
    "status": ("swarmrl.clients", "status"),
    "credentials": ("swarmrl.credentials", "main"),
    "setup": ("swarmrl.setup", "main"),
    "query": ("swarmrl.services.ledger.query", "main"),
    "research": ("swarmrl.research.cli", "main"),
    "export": ("swarmrl.export", "main"),
    "bootstrap-model": ("swarmrl.bootstrap.cli", "main"),
    "nats": ("swarmrl.infra.nats_cli", "main"),
}
"""Verb -> (module, entry function called with the remaining arguments)."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    from swarmrl.infra.nats_server import NatsServerNotFound

    try:
        return _run(argv[0], argv[1:])
    except ModuleNotFoundError as exc:  # `pip install swarmrl` is the agents' install, without the server
        if not _in_server_extra(exc.name or ""):
            raise
        raise SystemExit(
            f"swarmrl {argv[0]}: needs {exc.name}, which comes with the server: pip install 'swarmrl[server]'"
        ) from None
    except NatsServerNotFound as exc:
        raise SystemExit(f"swarmrl {argv[0]}: {exc}") from None


def _in_server_extra(module: str) -> bool:
    """Whether `module`'s distribution is one of the `server` extra's."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        required = requires("swarmrl") or []
    except PackageNotFoundError:  # run from a source tree that was never installed
        return False
    server = {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0] for r in required if 'extra == "server"' in r}
    return module.split(".")[0].replace("_", "-").lower() in {name.lower() for name in server}


def _run(verb: str, rest: list[str]) -> int:
    if verb == "serve":
        if not rest or rest[0] not in SERVICES:
            print(f"usage: swarmrl serve {{{','.join(SERVICES)}}} [--help]", file=sys.stderr)
            return 2
        name, entry = SERVE_ENTRIES.get(rest[0], (f"swarmrl.services.{rest[0]}.main", "main"))
        rest = _resolve_description(rest[0], rest[1:])
    elif verb in VERBS:
        name, entry = VERBS[verb]
    else:
        print(f"swarmrl: unknown command {verb!r}; try `swarmrl --help`", file=sys.stderr)
        return 2
    return int(getattr(importlib.import_module(name), entry)(rest) or 0)


def _resolve_description(service: str, argv: list[str]) -> list[str]:
    """`argv` with a `--config` swarm description (TOML, or `up`'s swarm.json) replaced by `service`'s
    configuration resolved from it as `swarmrl up` would (`--model` picks an engine's or trainer's
    model). A service's own resolved `--config` passes as it is."""
    import argparse
    import json
    import tempfile
    from pathlib import Path

    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config", type=Path)
    rest = pre.parse_known_args(argv)[1]  # every argument but the --config ones
    pre.add_argument("--model")
    known = pre.parse_known_args(argv)[0]
    path = known.config
    if path is None or not path.is_file():
        return argv
    from swarmrl.core.config import write_config_file
    from swarmrl.swarm import CONFIGS, SwarmConfigError, build, load, resolve_base, service_config

    if path.suffix != ".toml":  # a JSON description has models; else it is the service's own file
        try:
            data = json.loads(path.read_text() or "{}")
        except json.JSONDecodeError:
            return argv  # the service's own `--config` says what is wrong with it
        if not isinstance(data, dict) or "models" not in data:
            return argv
    if service not in CONFIGS:
        raise SystemExit(
            f"swarmrl serve {service}: --config takes its resolved configuration (JSON), not a swarm description"
        )
    try:
        swarm = build(load(path) if path.suffix == ".toml" else data, str(path))
        model = known.model or (next(iter(swarm.models)) if len(swarm.models) == 1 else None)
        placement: dict[str, Any] = {}
        if service in ("trainer", "engine") and model in swarm.models:
            build_it = "--print-config" not in argv
            placement["model_path"] = str(resolve_base(swarm.models[model], build=build_it))
        if service == "engine" and model in swarm.models:
            if (owner := swarm.engine_owner(model)) != model:
                raise SwarmConfigError(
                    f"{model} is served by {owner}'s engine (share_engine): serve --model {owner}"
                )
            placement["adapters"] = swarm.adapters(model)
        cfg = service_config(swarm, service, model, **placement)
    except SwarmConfigError as exc:
        raise SystemExit(f"swarmrl serve {service}: {exc}") from None
    resolved = write_config_file(Path(tempfile.mkdtemp(prefix="swarmrl-")) / f"{service}.json", service, cfg)
    return ["--config", str(resolved), *rest]  # the resolved one first, so flags still override it


if __name__ == "__main__":
    sys.exit(main())
