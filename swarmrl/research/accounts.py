"""One NATS account pair per run, so the runs of a study can share NATS servers without colliding.

Every swarm uses the same subjects, streams and KV buckets, and every run of a study may train a
model called `policy`. So each run gets its own copy of the two accounts of `infra/nats/accounts.conf`:

- `RUN_<id>`: a copy of SWARM with one service user of its own; its streams and KV exist there only.
- `RUN_<id>_AGENTS`: a copy of AGENTS importing from `RUN_<id>`; its users are the run's clients,
  minted by `up --nats-conf <conf dir>/runs/<key>` into that folder's own `agents.conf`.

The accounts are rendered from `runs.json` into `runs.conf` (included by `accounts.conf`) under a
file lock and applied by a config reload of every nats-server with a pid file in the conf dir, as
for agents (`infra/credentials.py`). When a run is over its streams and accounts are removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import re
import secrets
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from swarmrl.core.rundir import write_private
from swarmrl.infra import NATS_CONF_DIR
from swarmrl.infra.credentials import PID_SUFFIX, AgentRegistry, reload_servers
from swarmrl.infra.nats_server import RUNS_CONF

log = logging.getLogger("swarmrl.research")
REGISTRY = "runs.json"
KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,119}$")


@dataclass(frozen=True)
class RunAccount:
    key: str
    account: str
    user: str
    password: str
    conf_dir: Path
    """The run's own conf dir (`up --nats-conf`): its agents' registry, and links to the pid files."""

    def url(self, servers: list[str]) -> str:
        """The service URL of this run's account on `servers` (for `$SWARMRL_NATS`, never argv)."""
        return ",".join(
            f"nats://{self.user}:{self.password}@{u.hostname}:{u.port}" for u in map(urlsplit, servers)
        )


def _block(text: str, name: str) -> str:
    """The body of the top-level-in-`accounts` block `name { ... }` (braces matched)."""
    m = re.search(rf"(?m)^\s*{name}\s*\{{", text)
    if m is None:
        raise ValueError(f"accounts.conf has no {name} account")
    depth, i = 1, m.end()
    while depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[m.end() : i - 1]


def _tidy(body: str) -> str:
    return "\n" + "\n".join(line.rstrip() for line in body.splitlines() if line.strip()) + "\n"


def _sub1(pattern: str, repl: str, text: str, what: str) -> str:
    out, n = re.subn(pattern, lambda _: repl, text)
    if n != 1:
        raise ValueError(f"accounts.conf: expected one {what}, found {n}")
    return out


class RunAccounts:
    """The per-run accounts of the NATS servers whose conf dir is `conf_dir`."""

    def __init__(self, conf_dir: Path) -> None:
        self.conf_dir = Path(conf_dir)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, dict[str, str]]]:
        """The registry to change, saved and rendered on leaving (studies may share the servers)."""
        with open(self.conf_dir / ".runs.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.conf_dir / REGISTRY
            runs = json.loads(path.read_text()) if path.exists() else {}
            before = json.dumps(runs, sort_keys=True)
            yield runs
            if json.dumps(runs, sort_keys=True) != before:
                write_private(self.conf_dir / RUNS_CONF, self.render(runs), fsync=True)
                write_private(path, json.dumps(runs, indent=1, sort_keys=True), fsync=True)

    def render(self, runs: dict[str, dict[str, str]]) -> str:
        """`runs.conf`: a SWARM and an AGENTS account per run, copied from accounts.conf."""
        source = self.conf_dir / "accounts.conf"
        text = (source if source.exists() else NATS_CONF_DIR / "accounts.conf").read_text()
        text = re.sub(r"#[^\n]*", "", text)  # comments out
        swarm, agents = _block(text, "SWARM"), _block(text, "AGENTS")
        out = ["# Written by swarmrl research (swarmrl/research/accounts.py) from runs.json; do not edit.\n"]
        for key, r in sorted(runs.items()):
            users = f'users: [ {{ user: "{r["user"]}", password: "{r["password"]}" }} ]'
            # One full-access user per run: its services share it (role users live in SWARM only).
            body = _sub1(r'include\s+"services\.conf"', users, swarm, "users include in SWARM")
            mine = _sub1(r'include\s+"agents\.conf"', f'include "runs/{key}/agents.conf"', agents, "include")
            mine = re.sub(r"account\s*:\s*SWARM\b", f"account: {r['account']}", mine)
            out.append(
                f"# run {key}\n{r['account']} {{{_tidy(body)}}}\n{r['account']}_AGENTS {{{_tidy(mine)}}}\n"
            )
        return "\n".join(out)

    def create(self, key: str) -> RunAccount:
        """New accounts for run `key` (a fresh password if they existed), applied on the servers."""
        if not KEY_RE.match(key):
            raise ValueError(f"run key {key!r} must be 1-120 of [A-Za-z0-9_.-]")
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        sub = self.conf_dir / "runs" / key
        sub.mkdir(parents=True, exist_ok=True)
        AgentRegistry(sub).write_users()  # an empty user list: the include must exist before the reload
        for pid_file in self.conf_dir.glob(f"*{PID_SUFFIX}"):
            link = sub / pid_file.name
            if not link.is_symlink():
                link.symlink_to(Path("..", "..", pid_file.name))
        entry = {
            "account": f"RUN_{digest.upper()}",
            "user": f"run-{digest}",
            "password": "p" + secrets.token_hex(16),
        }
        with self._locked() as runs:
            runs[key] = entry
        if not reload_servers(self.conf_dir, wait_s=0):
            raise RuntimeError(
                f"no nats-server of {self.conf_dir} to reload: start each with `-P {self.conf_dir}/<name>.pid`"
            )
        return self._account(key, entry)

    def get(self, key: str) -> RunAccount | None:
        with self._locked() as runs:
            r = runs.get(key)
        return None if r is None else self._account(key, r)

    def _account(self, key: str, r: dict[str, str]) -> RunAccount:
        return RunAccount(key, r["account"], r["user"], r["password"], self.conf_dir / "runs" / key)

    def keys(self) -> list[str]:
        with self._locked() as runs:
            return sorted(runs)

    def remove(self, key: str, servers: list[str]) -> None:
        """Delete the run's streams (its JetStream data on the servers), then its accounts."""
        acct = self.get(key)
        if acct is None:
            return
        try:
            asyncio.run(asyncio.wait_for(_delete_streams(acct.url(servers)), timeout=20))
        except Exception as exc:  # the account goes anyway; say what may be left on the servers
            log.warning(
                "run %s: could not delete its streams (%s); its JetStream files stay on the servers", key, exc
            )
        with self._locked() as runs:
            runs.pop(key, None)
        reload_servers(self.conf_dir, wait_s=0)
        shutil.rmtree(acct.conf_dir, ignore_errors=True)


async def _delete_streams(url: str) -> None:
    import nats

    nc = await nats.connect(url, allow_reconnect=False, connect_timeout=3)
    try:
        js = nc.jetstream()
        for info in await js.streams_info():
            if info.config.name:
                await js.delete_stream(info.config.name)
    finally:
        await nc.close()


async def wait_usable(url: str, timeout: float = 15.0) -> None:
    """Until a service of the run's account can connect and reach JetStream: a reload admits the
    account's users before its JetStream is enabled."""
    import nats

    deadline, last = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        try:
            nc = await nats.connect(url, allow_reconnect=False, connect_timeout=2, max_reconnect_attempts=0)
            try:
                await nc.jetstream().account_info()
            finally:
                await nc.close()
            return
        except Exception as exc:  # refused, or JetStream not yet enabled, until the servers have reloaded
            last = repr(exc)
            await asyncio.sleep(0.1)
    raise TimeoutError(f"the run's NATS account was not usable after {timeout}s: {last}")
