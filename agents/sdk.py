"""Client SDK: an agent process joins the swarm, runs episodes, and talks to the models.

Publishes `begin`, `env`, `reward`, `end`, `abort` and `heartbeat` events to
`swarm.ep.<owner>.<id>.<kind>`; asks the gateway (request/reply on `swarm.auth.token.<owner>`) for a
signed episode token, which is the `api_key` of the OpenAI client it hands out. The SDK never holds
the signing secret. `<owner>` is the client's NATS identity (its credential's name); its episode ids
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
    """The OpenAI SDK's own async HTTP client, shared by a swarm client's episodes: closing one
    episode's `AsyncOpenAI` (`async with ep.openai() as llm`) must not close it under the others."""

    async def aclose(self) -> None:
        """Left open: the swarm client closes it (`close_shared`)."""

    async def close_shared(self) -> None:
        await super().aclose()


class _SharedSyncHttpClient(DefaultHttpxClient):
    """`_SharedHttpClient` for blocking clients."""

    def close(self) -> None:
        """Left open: the swarm client closes it (`close_shared`)."""

    def close_shared(self) -> None:
        super().close()


class GroupResults(list[Any]):
    """What `SwarmClient.group` returns: per episode, what `play` returned or the exception that
    aborted it; `group_key` names the group for `SwarmClient.outcome`."""

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
        """The identity this client's episodes belong to (its credential's name); "" on a URL
        connection, whose explicit episode ids may name any owner."""
        self.code_version = code_version
        self.retry_s = retry_s
        self.outcomes = OutcomeBook(self.state_key)
        """The outcomes of this client's groups its trainers sent (`outcome()`)."""
        self._http: _SharedHttpClient | None = None
        self._http_sync: _SharedSyncHttpClient | None = None

    @property
    def http_client(self) -> Any:
        """The HTTP connection pool every episode's `openai()` client shares (made on first use, in
        this event loop). A fresh `AsyncOpenAI` builds its own pool and TLS context, 59 ms of CPU on
        this project's 2-core machine against 0.2 ms on a shared pool: per episode, that is a fifth
        of the machine in `just up` (`bench/results/peers-10min/peers.md`). Shared, the connections to the
        gateway are kept alive and reused. Closing an episode's client leaves it open; `close()`
        closes it."""
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
        """Connect to the swarm.

        Args:
            where: The client's credential (`AgentCredential.read(connect_file)`), or NATS URL(s),
                comma-separated, for a service-role or unauthenticated server.
            client_id: Name of this client process recorded on events; default: the credential's
                name, else a random one.
            code_version: Version of the agent's code recorded on every event; see `default_code_version`.
            retry_s: How long transient NATS errors are retried before an operation fails.

        Returns:
            A connected client; close it with `await client.close()` or `async with`.
        """
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
            ping_interval=PING_INTERVAL_S,  # a link gone silent is replaced in seconds (bus.PING_INTERVAL_S)
            max_outstanding_pings=MAX_OUTSTANDING_PINGS,
            error_cb=_log_nats_error,  # one line per error: nats-py's default prints a traceback
        )
        client = cls(nc, client_id, code_version or default_code_version(), retry_s, owner)
        await client.outcomes.watch(nc)  # before any group: an outcome decided early is kept
        return client

    def episode(
        self,
        task_id: str,
        *,
        models: list[str] | None = None,
        agents: list[str] | None = None,
        agent_models: dict[str, list[str]] | None = None,
        group_key: str = "",
        group_size: int = 0,
        task: dict[str, Any] | None = None,
        eval: bool = False,
        episode_id: str | None = None,
        heartbeat_s: float = 10.0,
        token_ttl_s: float = 3600.0,
    ) -> Episode:
        """Create an episode; use it as `async with` (begin on enter, end or abort on exit).

        Args:
            task_id: Task identity; GRPO groups form over episodes with the same group key.
            models: Trainable models the episode may call; default: the union of `agent_models`.
                The gateway refuses an episode with no models.
            agents: Agent names (each gets its own token); default: the keys of `agent_models`,
                else `["agent"]`.
            agent_models: Per agent, the models its token may call (e.g. `{"caller": ["alpha"],
                "reporter": ["beta"]}`); an agent not listed may call all of `models`.
            group_key: Advantage group; defaults to `task_id`.
            group_size: How many episodes this client plays in the group (its GRPO group size); the
                trainer forms the group from that many. 0: not declared (the trainer's `num_repeat`).
            task: Free-form task description recorded by the ledger; its `"name"`, when present, is
                the task the gateway's task mixing weighs (`--task-weight`).
            eval: Evaluation episode: recorded, never trained on.
            episode_id: Explicit id, `<owner>` or `<owner>_<suffix>` (subject-safe); default:
                `<owner>_<random>`.
            heartbeat_s: Heartbeat period while the episode is open (0 disables).
            token_ttl_s: Lifetime of the episode's API tokens.

        Returns:
            An `Episode` (not yet begun).
        """
        per_agent = {str(a): list(ms) for a, ms in (agent_models or {}).items()}
        return Episode(
            self,
            task_id=task_id,
            models=list(models or dict.fromkeys(m for ms in per_agent.values() for m in ms)),
            agents=list(agents or per_agent or ["agent"]),
            agent_models=per_agent,
            group_key=group_key,
            group_size=group_size,
            task=dict(task or {}),
            eval=eval,
            episode_id=episode_id
            or S.new_episode_id(self.owner or S.owner_name(self.client_id), uuid.uuid4().hex),
            heartbeat_s=heartbeat_s,
            token_ttl_s=token_ttl_s,
        )

    async def group(
        self,
        task_id: str,
        play: Callable[[Episode], Awaitable[T]],
        *,
        size: int | None = None,
        group_key: str = "",
        **episode: Any,
    ) -> GroupResults:
        """Play one GRPO group: `size` episodes of `task_id` at once, each opened around `play(ep)`.

        A trainer learns from a group only: the spread of rewards over several tries at the same task
        instance. This is the one call that plays one.

        Args:
            task_id: The task instance every episode of the group plays.
            play: `async (ep) -> result`: one try (call the model with `ep.openai()` or `ep.base_url`
                + `ep.token()`, publish `await ep.reward(r)`). An exception aborts that episode only.
            size: Episodes in the group, declared on each `begin` (`group_size`); default:
                `DEFAULT_GROUP_SIZE`, the trainer's default `num_repeat`.
            group_key: Default: unique to this call, so this group never mixes with another.
            **episode: Passed to `episode()` (`models`, `task`, `agent_models`, ...).

        Returns:
            Per episode, what `play` returned, or the exception that aborted it (a list); its
            `group_key` names the group for `outcome()`.
        """
        size = DEFAULT_GROUP_SIZE if size is None else size
        if size < 1:
            raise ValueError(f"a group needs at least one episode, got size={size}")
        key = group_key or f"{task_id}@{self.client_id}-{os.urandom(4).hex()}"

        async def one() -> T:
            async with self.episode(task_id, group_key=key, group_size=size, **episode) as ep:
                return await play(ep)

        await self.outcomes.watch(self.nc)
        results = await asyncio.gather(*(one() for _ in range(size)), return_exceptions=True)
        if all(isinstance(r, BaseException) for r in results) and not episode.get(
            "eval"
        ):  # no trainer hears of this group
            models = episode.get("models") or [
                m for ms in (episode.get("agent_models") or {}).values() for m in ms
            ]
            for model in dict.fromkeys(models):
                self.outcomes.add(
                    GroupOutcome(
                        model=model,
                        owner=self.state_key,
                        group_key=key,
                        task=str((episode.get("task") or {}).get("name", "")),
                        client_id=self.client_id,
                        outcome="dropped",
                        reason="failed_episodes",
                        step=-1,
                        episodes=size,
                    )
                )
        return GroupResults(results, key)

    async def evaluate(
        self, task_id: str, play: Callable[[Episode], Awaitable[T]], *, samples: int = 1, **episode: Any
    ) -> GroupResults:
        """Play `samples` held-out evaluation episodes of `task_id` at once (`group` with `eval=True`):
        recorded with the policy versions that served them, never trained. The report plots each
        task's rate per version (`end(success=...)`, else reward > 0) beside the built-in evaluations."""
        return await self.group(task_id, play, size=samples, eval=True, **episode)

    async def outcome(
        self, group_key: str, *, model: str | None = None, timeout: float = 120.0
    ) -> GroupOutcome:
        """What became of group `group_key` (for `model`; default: the first model to decide): trained
        (`step`, `reward_std`) or dropped (`reason`: `zero_adv`, `stale`, `timeout`, ...;
        `describe(outcome)` says it in words). A trainer decides once the group is complete, and
        sends a trained group's outcome after the step that trained it. Raises TimeoutError after
        `timeout` seconds without one."""
        await self.outcomes.watch(self.nc)
        return await self.outcomes.wait(group_key, model, timeout)

    async def publish(self, event: EventBase) -> None:
        """Publish one event idempotently (Nats-Msg-Id), retrying transient errors. An event over the
        contract's size limit is refused here: the server would close the connection for it."""
        subject = S.episode_subject(event.episode_id, event.kind)  # type: ignore[attr-defined]
        data = encode(event)
        if len(data) > MAX_EVENT_BYTES:
            raise SwarmError(
                f"{event.kind} event of {len(data)} bytes is over the {MAX_EVENT_BYTES}-byte limit"
            )  # type: ignore[attr-defined]
        await retried(self.retry_s, self.js.publish, subject, data, headers={"Nats-Msg-Id": event.msg_id})

    @property
    def state_key(self) -> str:
        """This client's key in KV `swarm-clients`: its owner name (its credential's), else one made
        from its client id."""
        return self.owner or S.owner_name(self.client_id)

    async def load_state(self) -> ClientState | None:
        """The `ClientState` this client (by `state_key`: the same name after a restart) saved last, or
        None when it saved none. A direct get of its own KV key, the one read an agent may make."""
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
        with contextlib.suppress(
            OSError, RuntimeError, nats.errors.Error
        ):  # already closed, or the server gone
            await self.nc.drain()
        if self._http is not None:
            await self._http.close_shared()
        if self._http_sync is not None:
            self._http_sync.close_shared()

    async def __aenter__(self) -> SwarmClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
