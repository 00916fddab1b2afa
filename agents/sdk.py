"""Client SDK: an agent process joins the swarm, runs episodes, and talks to the models.

Episode events go to `swarm.ep.<owner>.<id>.<kind>`; the gateway signs each episode's token (the
`api_key` of the OpenAI clients handed out). `<owner>` is the client's NATS identity; its episode ids
are `<owner>_<random>`.

    credential = AgentCredential.read(os.environ["SWARMRL_CONNECT_FILE"])
    async with await SwarmClient.connect(credential) as swarm:
        async with swarm.episode("task-7", models=["policy"]) as ep:
            llm = ep.openai()                      # openai.AsyncOpenAI bound to this episode
            reply = await llm.chat.completions.create(model="policy", messages=[...])
            await ep.reward(1.0)
        # leaving the block publishes `end`; an exception inside publishes `abort` and re-raises
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import nats
from nats.aio.client import Client as NATS
from nats.js.errors import NotFoundError
from nats.js.kv import KV_DEL, KV_OP, KV_PURGE
from openai import DefaultAsyncHttpxClient, DefaultHttpxClient

from swarmrl.agents.episode import TRANSIENT, Episode, SwarmError, retried
from swarmrl.agents.outcomes import OutcomeBook, describe
from swarmrl.infra.credentials import AgentCredential
from swarmrl.schemas import (
    DEFAULT_GROUP_SIZE,
    MAX_EVENT_BYTES,
    ClientState,
    EventBase,
    GroupOutcome,
    decode,
    encode,
)
from swarmrl.schemas import subjects as S
from swarmrl.services.common.bus import MAX_OUTSTANDING_PINGS, PING_INTERVAL_S

__all__ = [
    "TRANSIENT",
    "Episode",
    "GroupOutcome",
    "GroupResults",
    "SwarmClient",
    "SwarmError",
    "default_code_version",
    "describe",
]

T = TypeVar("T")

log = logging.getLogger("swarmrl.sdk")


def default_code_version() -> str:
    """`$SWARMRL_CODE_VERSION`, else a content hash of the running script, else "unknown"."""
    if v := os.environ.get("SWARMRL_CODE_VERSION"):
        return v
    main = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if main is not None and main.is_file():
        return "sha1-" + hashlib.sha1(main.read_bytes()).hexdigest()[:12]
    return "unknown"


async def _log_nats_error(exc: Exception) -> None:
    log.warning("nats: %s", exc or type(exc).__name__)


class _SharedHttpClient(DefaultAsyncHttpxClient):
    """The OpenAI SDK's async HTTP client, shared by a swarm client's episodes: closing one episode's
    `AsyncOpenAI` leaves it open; the swarm client closes it (`close_shared`)."""

    async def aclose(self) -> None:
        pass

    async def close_shared(self) -> None:
        await super().aclose()


class _SharedSyncHttpClient(DefaultHttpxClient):
    """`_SharedHttpClient` for blocking clients."""

    def close(self) -> None:
        pass

    def close_shared(self) -> None:
        super().close()


class GroupResults(list[Any]):
    """Per episode, what `play` returned or the exception that aborted it; `group_key` names the
    group for `SwarmClient.outcome`."""

    def __init__(self, results: list[Any], group_key: str) -> None:
        super().__init__(results)
        self.group_key = group_key


class SwarmClient:
    """One agent process's connection to the swarm (NATS, agent credentials)."""

    def __init__(
        self, nc: NATS, client_id: str, code_version: str, retry_s: float = 30.0, owner: str = ""
    ) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.client_id = client_id
        self.owner = owner
        """The identity owning this client's episodes; "" on a URL connection (any owner)."""
        self.code_version = code_version
        self.retry_s = retry_s
        self.outcomes = OutcomeBook(self.state_key)
        self._http: _SharedHttpClient | None = None
        self._http_sync: _SharedSyncHttpClient | None = None

    @property
    def http_client(self) -> Any:
        """The HTTP connection pool every episode's `openai()` client shares (made on first use): a
        fresh pool per episode costs far more CPU (`bench/results/peers-10min/peers.md`)."""
        if self._http is None or self._http.is_closed:
            self._http = _SharedHttpClient()
        return self._http

    @property
    def http_client_sync(self) -> Any:
        """`http_client` for the blocking `openai_sync()` clients."""
        if self._http_sync is None or self._http_sync.is_closed:
            self._http_sync = _SharedSyncHttpClient()
        return self._http_sync

    @classmethod
    async def connect(
        cls,
        where: AgentCredential | str,
        *,
        client_id: str | None = None,
        code_version: str | None = None,
        retry_s: float = 30.0,
    ) -> SwarmClient:
        """Connect with a credential (`AgentCredential.read(connect_file)`) or comma-separated NATS
        URL(s) (service-role or unauthenticated servers). `client_id` (default: the credential's name,
        else random) and `code_version` are recorded on events; transient NATS errors are retried for
        `retry_s`."""
        if isinstance(where, AgentCredential):
            options: dict[str, Any] = where.nats_options()
            client_id, owner = client_id or where.name, where.name
        else:
            options = {"servers": [u.strip() for u in where.split(",")]}
            client_id, owner = client_id or f"client-{uuid.uuid4().hex[:12]}", ""
        nc = await nats.connect(
            **options,
            name="swarmrl-agent",
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            ping_interval=PING_INTERVAL_S,
            max_outstanding_pings=MAX_OUTSTANDING_PINGS,
            error_cb=_log_nats_error,  # one line per error, not nats-py's traceback
        )
        client = cls(nc, client_id, code_version or default_code_version(), retry_s, owner)
        await client.outcomes.watch(nc)  # before any group: an outcome decided early is kept
        return client

    def episode(self, task_id: str, **options: Any) -> Episode:
        """An `Episode` of this client (not yet begun; `options`: see there), to use as `async with`."""
        return Episode(self, task_id, **options)

    async def group(
        self,
        task_id: str,
        play: Callable[[Episode], Awaitable[T]],
        *,
        size: int | None = None,
        group_key: str = "",
        **episode: Any,
    ) -> GroupResults:
        """Play one GRPO group: `size` episodes of `task_id` at once (default `DEFAULT_GROUP_SIZE`),
        each opened around `play(ep)`; an exception aborts that episode only. `group_key` defaults to
        one unique to this call; `**episode` goes to `episode()`."""
        size = DEFAULT_GROUP_SIZE if size is None else size
        if size < 1:
            raise ValueError(f"a group needs at least one episode, got size={size}")
        key = group_key or f"{task_id}@{self.client_id}-{os.urandom(4).hex()}"

        async def one() -> T:
            async with self.episode(task_id, group_key=key, group_size=size, **episode) as ep:
                return await play(ep)

        await self.outcomes.watch(self.nc)
        results = await asyncio.gather(*(one() for _ in range(size)), return_exceptions=True)
        if not episode.get("eval") and all(isinstance(r, BaseException) for r in results):
            # no trainer hears of this group: its outcome is known here
            models = episode.get("models") or [
                m for ms in (episode.get("agent_models") or {}).values() for m in ms
            ]
            task = str((episode.get("task") or {}).get("name", ""))
            for model in dict.fromkeys(models):
                dropped = GroupOutcome(
                    model=model, owner=self.state_key, group_key=key, task=task, client_id=self.client_id,
                    outcome="dropped", reason="failed_episodes", step=-1, episodes=size,
                )  # fmt: skip
                self.outcomes.add(dropped)
        return GroupResults(results, key)

    async def evaluate(
        self, task_id: str, play: Callable[[Episode], Awaitable[T]], *, samples: int = 1, **episode: Any
    ) -> GroupResults:
        """Play `samples` held-out evaluation episodes of `task_id` at once (`group` with `eval=True`):
        recorded, never trained; the report plots each task's rate per policy version."""
        return await self.group(task_id, play, size=samples, eval=True, **episode)

    async def outcome(
        self, group_key: str, *, model: str | None = None, timeout: float = 120.0
    ) -> GroupOutcome:
        """What became of group `group_key` (for `model`; default: the first to decide): trained or
        dropped (`describe(outcome)` says it in words). Raises TimeoutError after `timeout` seconds."""
        await self.outcomes.watch(self.nc)
        return await self.outcomes.wait(group_key, model, timeout)

    async def publish(self, event: EventBase) -> None:
        """Publish one event idempotently (Nats-Msg-Id), retrying transient errors; an oversized
        event is refused here (the server would close the connection for it)."""
        kind = event.kind  # type: ignore[attr-defined]
        data = encode(event)
        if len(data) > MAX_EVENT_BYTES:
            raise SwarmError(f"{kind} event of {len(data)} bytes is over the {MAX_EVENT_BYTES}-byte limit")
        subject = S.episode_subject(event.episode_id, kind)
        await retried(self.retry_s, self.js.publish, subject, data, headers={"Nats-Msg-Id": event.msg_id})

    @property
    def state_key(self) -> str:
        """This client's key in KV `swarm-clients`: its owner name, else one made from its client id."""
        return self.owner or S.owner_name(self.client_id)

    async def load_state(self) -> ClientState | None:
        """The `ClientState` this client (by `state_key`, so also before a restart) saved last, or None."""
        put, _ = S.client_state_subjects(self.state_key)
        try:
            msg = await retried(
                self.retry_s, self.js.get_msg, f"KV_{S.CLIENTS_BUCKET}", subject=put, direct=True
            )
        except NotFoundError:
            return None
        if not msg.data or (msg.headers or {}).get(KV_OP) in (KV_DEL, KV_PURGE):
            return None
        return decode(msg.data, ClientState)

    async def save_state(self, state: ClientState) -> None:
        """Store `state` under this client's key of KV `swarm-clients` (a JetStream publish)."""
        put, _ = S.client_state_subjects(self.state_key)
        await retried(self.retry_s, self.js.publish, put, encode(state))

    async def close(self) -> None:
        """Flush and close the NATS connection and the shared HTTP connection pools."""
        with contextlib.suppress(OSError, RuntimeError, nats.errors.Error):  # closed, or server gone
            await self.nc.drain()
        if self._http is not None:
            await self._http.close_shared()
        if self._http_sync is not None:
            self._http_sync.close_shared()

    async def __aenter__(self) -> SwarmClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
