"""Per-client NATS identities for agents: nkey users in the AGENTS account, minted and revoked here.

Each agent client gets its own nkey (an ed25519 key pair; the server keeps only the public key and
the client proves it holds the seed by signing the server's nonce) and a name, its `owner` in the
subject layout (`schemas/subjects.py`): the server lets it publish only into its own episodes and
subscribe only under its own inbox prefix, and no service traffic is visible from its account.

A *conf dir* holds the server config (`single.conf` or a cluster node's, `accounts.conf`) and the two
files kept here: `agents.json` (the registry: name -> public key) and `agents.conf` (the AGENTS
account's user list, rendered from the registry and included by `accounts.conf`). Minting or revoking
rewrites both and asks every nats-server with a pid file in the conf dir to reload its config; a
revoked client is disconnected at once and cannot log in again. A client's secret lives only in its
credential file (mode 0600), handed over by path (`$SWARMRL_CONNECT_FILE`), never on a command line.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nkeys

from swarmrl.core.rundir import write_private
from swarmrl.schemas import subjects as S

REGISTRY = "agents.json"
USERS_CONF = "agents.conf"
SERVICE_USERS_CONF = "services.conf"
OPERATOR = "service"
"""The SWARM account's full-access user: `swarmrl up` sets streams up and runs the control plane with
it, and `swarmrl clients/status/down` and research runs use it; services use their roles' users."""
PID_SUFFIX = ".pid"


@dataclass(frozen=True)
class AgentCredential:
    """What one agent client needs to connect: servers, its name and its nkey seed (the secret)."""

    name: str
    seed: str
    servers: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    """Swarm facts for the client (`models`, `tasks`), written alongside in the connect file."""

    @property
    def public_key(self) -> str:
        return str(nkeys.from_seed(self.seed.encode()).public_key.decode())

    @property
    def inbox_prefix(self) -> str:
        return S.inbox_prefix(self.name)

    def nats_options(self) -> dict[str, Any]:
        """Keyword arguments for `nats.connect` (nats-py)."""
        return {"servers": self.servers, "nkeys_seed_str": self.seed, "inbox_prefix": self.inbox_prefix}

    def with_servers(self, servers: list[str]) -> AgentCredential:
        return AgentCredential(self.name, self.seed, servers, self.extra)

    def write(self, path: Path) -> Path:
        """The connect file: JSON readable by its owner only (see schemas/README.md, Connecting)."""
        info = {
            "nats_url": ",".join(self.servers),
            "name": self.name,
            "seed": self.seed,
            "inbox_prefix": self.inbox_prefix,
            **self.extra,
        }
        return write_private(path, json.dumps(info, indent=2))

    @classmethod
    def read(cls, path: str | Path) -> AgentCredential:
        info = json.loads(Path(path).read_text())
        missing = [k for k in ("nats_url", "name", "seed") if not info.get(k)]
        if missing:
            raise ValueError(f"connect file {path} lacks {missing}; mint one with `swarmrl credentials mint`")
        extra = {k: v for k, v in info.items() if k not in ("nats_url", "name", "seed", "inbox_prefix")}
        servers = [u.strip() for u in str(info["nats_url"]).split(",")]
        return cls(str(info["name"]), str(info["seed"]), servers, extra)


def new_seed() -> str:
    return str(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER).decode())


@dataclass
class AgentRegistry:
    """The agent identities one set of NATS servers accepts (a conf dir; see the module docstring)."""

    conf_dir: Path

    def __post_init__(self) -> None:
        self.conf_dir = Path(self.conf_dir)

    @property
    def registry_path(self) -> Path:
        return self.conf_dir / REGISTRY

    def load(self) -> dict[str, str]:
        """name -> public key of every client allowed in."""
        if not self.registry_path.exists():
            return {}
        return dict(json.loads(self.registry_path.read_text()))

    def mint(self, name: str, servers: list[str] | None = None, reload: bool = True) -> AgentCredential:
        """A new identity `name` (a fresh key if it already existed: the old key stops working)."""
        cred = AgentCredential(S.check_owner(name), new_seed(), servers or [])
        agents = self.load() | {name: cred.public_key}
        self._save(agents, reload)
        return cred

    def revoke(self, name: str, reload: bool = True) -> bool:
        """Remove `name`; its connections are closed by the reload. False if it was not there."""
        agents = self.load()
        if agents.pop(name, None) is None:
            return False
        self._save(agents, reload)
        return True

    def render(self) -> str:
        """The AGENTS account's `users` list (NATS config; JSON is valid NATS config syntax)."""
        users = [
            {"nkey": key, "permissions": S.agent_permissions(name)}
            for name, key in sorted(self.load().items())
        ]
        header = "# Written by swarmrl (infra/credentials.py) from agents.json; do not edit.\n"
        return f"{header}users: {json.dumps(users, indent=1)}\n"

    def write_users(self) -> None:
        """Write the user lists `accounts.conf` includes: the agents' (`agents.conf`, from the
        registry) and the services' (`services.conf`, `render_service_users`)."""
        write_private(self.conf_dir / USERS_CONF, self.render())
        write_private(self.conf_dir / SERVICE_USERS_CONF, render_service_users())

    def _save(self, agents: dict[str, str], reload: bool) -> None:
        write_private(self.registry_path, json.dumps(agents, indent=1, sort_keys=True))
        self.write_users()
        if reload:
            reload_servers(self.conf_dir)


def reload_servers(conf_dir: Path, wait_s: float = 0.5) -> int:
    """SIGHUP (config reload) every live nats-server of `conf_dir` (each writes `<name>.pid` there
    with -P); returns how many were signalled. A reload applies within milliseconds; `wait_s` gives
    it that time, so a client minted and started at once is not refused (`NatsServer.reload` waits
    for the server's own log line instead)."""
    signalled = 0
    for path in sorted(Path(conf_dir).glob(f"*{PID_SUFFIX}")):
        with contextlib.suppress(ValueError, OSError):  # a stale pid file: no such process
            os.kill(int(path.read_text().strip()), signal.SIGHUP)
            signalled += 1
    if signalled and wait_s > 0:
        time.sleep(wait_s)
    return signalled


def password_var(role: str) -> str:
    """The environment variable holding `role`'s NATS password (nats-server resolves `$VARS` in its
    config from its environment): `SWARM_SERVICE_PASSWORD`, `SWARM_ACTION_WORKER_PASSWORD`, ..."""
    return f"SWARM_{role.upper().replace('-', '_')}_PASSWORD"


def render_service_users() -> str:
    """The SWARM account's `users` list: the operator, then one user per service role with the
    permissions of `schemas/subjects.py` (`service_permissions`). Passwords stay out of the file:
    each is a variable the server reads from its environment (`password_var`)."""
    users = [f"  {{ user: {OPERATOR}, password: ${password_var(OPERATOR)} }}"]
    for role in S.SERVICE_ROLES:
        perms = json.dumps(S.service_permissions(role))
        users.append(f'  {{ user: "{role}", password: ${password_var(role)}, permissions: {perms} }}')
    header = "# Written by swarmrl (infra/credentials.py) from schemas/subjects.py; do not edit.\n"
    return header + "users: [\n" + "\n".join(users) + "\n]\n"
