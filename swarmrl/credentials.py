"""`swarmrl credentials`: mint, revoke and list agent clients' NATS identities, also while a swarm runs.

    swarmrl credentials mint my-agent                # -> runs/latest/clients/my-agent.json (mode 0600)
    SWARMRL_CONNECT_FILE=runs/latest/clients/my-agent.json node agent.mjs
    swarmrl credentials revoke my-agent              # disconnected now, refused from now on
    swarmrl credentials list

Each identity is an nkey user of the AGENTS account (`infra/credentials.py`): it may publish only
its own episodes' events and subscribe only to its own inbox. The registry lives in a conf dir: the
latest run's embedded server's (`<run>/nats/conf`), or `--conf-dir` for servers you run yourself
(their accounts.conf includes agents.conf from it; each writes its pid there with
`nats-server -P <dir>/<node>.pid`, so a change reaches it as a config reload).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from swarmrl.core.config import password_on_command_line
from swarmrl.infra.credentials import AgentCredential, AgentRegistry, reload_servers
from swarmrl.launch import CONNECT_FILE


def _locate(args: argparse.Namespace) -> tuple[Path, Path | None]:
    """(conf dir, run dir or None)."""
    if args.conf_dir is not None:
        return args.conf_dir, args.run_dir
    from swarmrl.core.rundir import latest_run_dir

    run_dir = args.run_dir or latest_run_dir()
    if run_dir is None:
        raise SystemExit("swarmrl credentials: no run found; pass --run-dir or --conf-dir")
    conf = run_dir / "nats" / "conf"
    if not conf.is_dir():
        raise SystemExit(f"swarmrl credentials: {run_dir} has no embedded NATS server; pass --conf-dir")
    return conf, run_dir


def _template(run_dir: Path | None, nats_url: str) -> AgentCredential | None:
    """The run's outside-agent connect file, whose servers and swarm facts a new identity copies."""
    servers = [u.strip() for u in nats_url.split(",")]
    if run_dir is not None and (run_dir / CONNECT_FILE).exists():
        cred = AgentCredential.read(run_dir / CONNECT_FILE)
        return cred.with_servers(servers) if nats_url else cred
    return AgentCredential("template", "", servers) if nats_url else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="swarmrl credentials", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("action", choices=("mint", "revoke", "list"))
    p.add_argument("name", nargs="?", help="client name: 1-64 of [A-Za-z0-9-] (mint, revoke)")
    p.add_argument("--run-dir", type=Path, default=None, help="the run (default: the latest `swarmrl up`)")
    p.add_argument("--conf-dir", type=Path, default=None, help="the servers' conf dir (default: the run's)")
    p.add_argument(
        "--nats", default="", help="server URL(s) written into the connect file (default: the run's)"
    )
    p.add_argument("--out", type=Path, help="connect file to write (default <run>/clients/NAME.json)")
    args = p.parse_args(argv)
    if reason := password_on_command_line(argv):
        p.error(reason)
    if args.action != "list" and not args.name:
        p.error(f"{args.action} needs a client NAME")
    conf, run_dir = _locate(args)
    registry = AgentRegistry(conf)
    if args.action == "list":
        print(json.dumps(registry.load(), indent=1, sort_keys=True))
        return 0
    if args.action == "revoke":
        if not registry.revoke(args.name, reload=False):
            print(f"swarmrl credentials: no client named {args.name!r} in {conf}", file=sys.stderr)
            return 1
        n = reload_servers(conf)
        print(f"revoked {args.name} ({n} server(s) reloaded; its connections are closed)")
        return 0
    template = _template(run_dir, args.nats)
    if template is None:
        p.error("no run to copy the server URL from: pass --nats URL")
    out = args.out or (run_dir or conf) / "clients" / f"{args.name}.json"
    try:
        cred = registry.mint(args.name, template.servers, reload=False)
    except ValueError as exc:
        p.error(str(exc))
    AgentCredential(cred.name, cred.seed, template.servers, template.extra).write(out)
    n = reload_servers(conf)
    print(
        f"minted {cred.name} -> {out} ({n} server(s) reloaded); start the agent with SWARMRL_CONNECT_FILE={out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
