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
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import nats
from nats.aio.client import Client as NATS
from nats.js.errors import NotFoundError
from nats.js.kv import KV_DEL, KV_OP, KV_PURGE
from openai import DefaultAsyncHttpxClient, DefaultHttpxClient
from pydantic import ValidationError

from swarmrl.infra.credentials import AgentCredential
from swarmrl.schemas import (
    MAX_EVENT_BYTES,
    AbortEvent,
    ActionRequest,
    ActionResult,
    BeginEvent,
    ClientState,
    EndEvent,
    EnvEvent,
    EventBase,
    HeartbeatEvent,
    RewardEvent,
    TokenReply,
    TokenRequest,
    decode,
    encode,
)
from swarmrl.schemas import subjects as S
from swarmrl.services.common.bus import MAX_OUTSTANDING_PINGS, PING_INTERVAL_S
from swarmrl.services.common.retry import TRANSIENT as RETRY_TRANSIENT
from swarmrl.services.common.retry import within

T = TypeVar("T")

log = logging.getLogger("swarmrl.sdk")

TRANSIENT = (*RETRY_TRANSIENT, nats.errors.OutboundBufferLimitError)
"""What the SDK retries for its `retry_s`: the services' transient failures (timeouts, no responders,
reconnecting, a stream between leaders when a node of a cluster died) and a full outbound buffer."""


ACT_ASK_S = 30.0
"""`Episode.act` repeats its request this often until the result comes (the same action id)."""


class SwarmError(RuntimeError):
    """The swarm refused a request (e.g. the gateway would not mint a token); the message says why."""


def default_code_version() -> str:
    """`$SWARMRL_CODE_VERSION`, else a content hash of the running script, else "unknown"."""
    if v := os.environ.get("SWARMRL_CODE_VERSION"):
        return v
    main = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if main is not None and main.is_file():
        return "sha1-" + hashlib.sha1(main.read_bytes()).hexdigest()[:12]
    return "unknown"


async def _retrying(fn: Any, *args: Any, retry_s: float, **kwargs: Any) -> Any:
    return await within(retry_s, fn, *args, transient=TRANSIENT, **kwargs)


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
        self._http: _SharedHttpClient | None = None
        self._http_sync: _SharedSyncHttpClient | None = None

    @property
    def http_client(self) -> Any:
        """The HTTP connection pool every episode's `openai()` client shares (made on first use, in
        this event loop). A fresh `AsyncOpenAI` builds its own pool and TLS context, 59 ms of CPU on
        this project's 2-core machine against 0.2 ms on a shared pool: per episode, that was a fifth
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
        return cls(nc, client_id, code_version or default_code_version(), retry_s, owner)

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
    ) -> list[T | BaseException]:
        """Play one GRPO group: `size` episodes of `task_id` at once, each opened around `play(ep)`.

        A trainer learns from a group only: the spread of rewards over several tries at the same task
        instance. This is the one call that plays one.

        Args:
            task_id: The task instance every episode of the group plays.
            play: `async (ep) -> result`: one try (call the model with `ep.openai()` or `ep.base_url`
                + `ep.token()`, publish `await ep.reward(r)`). An exception aborts that episode only.
            size: Episodes in the group, declared on each `begin` (`group_size`); default: the
                trainer's declared default (`num_repeat`).
            group_key: Default: unique to this call, so this group never mixes with another.
            **episode: Passed to `episode()` (`models`, `task`, `agent_models`, ...).

        Returns:
            Per episode, what `play` returned, or the exception that aborted it.
        """
        if size is None:
            from swarmrl.core.config import default_of
            from swarmrl.services.trainer.config import TrainerConfig

            size = int(default_of(TrainerConfig, "num_repeat"))
        if size < 1:
            raise ValueError(f"a group needs at least one episode, got size={size}")
        key = group_key or f"{task_id}@{self.client_id}-{os.urandom(4).hex()}"

        async def one() -> T:
            async with self.episode(task_id, group_key=key, group_size=size, **episode) as ep:
                return await play(ep)

        return list(await asyncio.gather(*(one() for _ in range(size)), return_exceptions=True))

    async def publish(self, event: EventBase) -> None:
        """Publish one event idempotently (Nats-Msg-Id), retrying transient errors. An event over the
        contract's size limit is refused here: the server would close the connection for it."""
        subject = S.episode_subject(event.episode_id, event.kind)  # type: ignore[attr-defined]
        data = encode(event)
        if len(data) > MAX_EVENT_BYTES:
            raise SwarmError(
                f"{event.kind} event of {len(data)} bytes is over the {MAX_EVENT_BYTES}-byte limit"
            )  # type: ignore[attr-defined]
        await _retrying(
            self.js.publish,
            subject,
            data,
            headers={"Nats-Msg-Id": event.msg_id},
            retry_s=self.retry_s,
        )

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
            msg = await _retrying(
                self.js.get_msg, f"KV_{S.CLIENTS_BUCKET}", subject=put, direct=True, retry_s=self.retry_s
            )
        except NotFoundError:
            return None
        if not msg.data or (msg.headers or {}).get(KV_OP) in (KV_DEL, KV_PURGE):
            return None
        return decode(msg.data, ClientState)

    async def save_state(self, state: ClientState) -> None:
        """Store `state` under this client's key of KV `swarm-clients` (a JetStream publish)."""
        put, _ = S.client_state_subjects(self.state_key)
        await _retrying(self.js.publish, put, encode(state), retry_s=self.retry_s)

    async def close(self) -> None:
        """Flush and close the NATS connection and the shared HTTP connection pools."""
        with contextlib.suppress(Exception):
            await self.nc.drain()
        if self._http is not None:
            await self._http.close_shared()
        if self._http_sync is not None:
            self._http_sync.close_shared()

    async def __aenter__(self) -> SwarmClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Episode:
    """One episode's lifecycle. Events carry a per-episode sequence number starting at 0 (begin)."""

    def __init__(
        self,
        client: SwarmClient,
        *,
        task_id: str,
        models: list[str],
        agents: list[str],
        agent_models: dict[str, list[str]],
        group_key: str,
        task: dict[str, Any],
        eval: bool,
        episode_id: str,
        heartbeat_s: float,
        token_ttl_s: float,
        group_size: int = 0,
    ) -> None:
        if client.owner and S.episode_owner(episode_id) != client.owner:
            raise SwarmError(
                f"episode id {episode_id!r} is not this client's: its ids are {client.owner!r} or "
                f"'{client.owner}_<suffix>' (the server refuses events for any other)"
            )
        self.client = client
        self.episode_id = episode_id
        self.task_id, self.models, self.agents, self.agent_models = task_id, models, agents, agent_models
        self.group_key, self.group_size, self.task, self.eval = group_key, group_size, task, eval
        self.heartbeat_s, self.token_ttl_s = heartbeat_s, token_ttl_s
        self.tokens: dict[str, str] = {}
        self.base_url = ""
        self.closed = False
        self._seq = 0
        self._actions = 0
        self._lock = asyncio.Lock()
        self._heartbeat: asyncio.Task[None] | None = None

    def _token_request(self) -> TokenRequest:
        """This episode's `TokenRequest` (validated: a bad one is never sent)."""
        return TokenRequest(
            agents=self.agents, models=self.models, ttl_s=self.token_ttl_s,
            group_key=self.group_key or self.task_id,  # resolved as the merger and trainer do
            eval=self.eval, agent_models=self.agent_models or {},
            task=self.task["name"] if isinstance(self.task.get("name"), str) else "", **self._common(),
        )  # fmt: skip

    def _common(self) -> dict[str, Any]:
        return {
            "episode_id": self.episode_id,
            "client_id": self.client.client_id,
            "client_version": self.client.code_version,
        }

    async def _publish(self, cls: type[EventBase], final: bool = False, **fields: Any) -> None:
        async with self._lock:  # sequence numbers must reach the stream in order
            if self.closed:
                raise SwarmError(f"episode {self.episode_id} is already closed")
            event = cls(seq=self._seq, **self._common(), **fields)
            await self.client.publish(event)
            self._seq += 1
            self.closed = final

    async def begin(self) -> Episode:
        """Get the episode's API tokens from the gateway, then publish `begin`."""
        try:
            request = self._token_request()
        except ValidationError as exc:  # e.g. a NaN lifetime: refused before it is sent
            raise SwarmError(f"bad token request for episode {self.episode_id}: {exc}") from None
        while True:
            reply = await _retrying(
                self.client.nc.request,
                S.token_subject(S.episode_owner(self.episode_id)),
                encode(request),
                timeout=10.0,
                retry_s=self.client.retry_s,
            )
            answer = decode(reply.data, TokenReply)
            # Admission control (the trainer is behind) or task mixing (this task is ahead of its
            # share): the gateway asks new groups to wait.
            if answer.retry_after_s is None:
                break
            await asyncio.sleep(answer.retry_after_s)
        if answer.error is not None or answer.tokens is None or answer.base_url is None:
            raise SwarmError(f"gateway refused a token for episode {self.episode_id}: {answer.error}")
        self.tokens, self.base_url = dict(answer.tokens), answer.base_url
        await self._publish(
            BeginEvent,
            task_id=self.task_id,
            group_key=self.group_key,
            group_size=self.group_size,
            task=self.task,
            models=self.models,
            agents=self.agents,
            eval=self.eval,
        )
        if self.heartbeat_s > 0:
            self._heartbeat = asyncio.create_task(self._beat())
        return self

    async def _beat(self) -> None:
        while not self.closed:
            await asyncio.sleep(self.heartbeat_s)
            try:
                await self._publish(HeartbeatEvent)
            except SwarmError:
                return
            except Exception as exc:  # a missed heartbeat must never kill the agent
                log.warning("heartbeat failed for episode %s: %s", self.episode_id, exc)

    def token(self, agent: str | None = None) -> str:
        """The signed API token of `agent` (default: the first agent)."""
        agent = agent or self.agents[0]
        if agent not in self.tokens:
            raise SwarmError(f"no token for agent {agent!r}; episode agents are {self.agents}")
        return self.tokens[agent]

    def openai(self, agent: str | None = None, **kwargs: Any) -> Any:
        """An `openai.AsyncOpenAI` client for `agent`, pointed at the gateway with this episode's token,
        on the swarm client's shared connection pool (`SwarmClient.http_client`; pass `http_client=`
        for another)."""
        from openai import AsyncOpenAI

        kwargs.setdefault("http_client", self.client.http_client)
        return AsyncOpenAI(base_url=self.base_url, api_key=self.token(agent), **kwargs)

    def openai_sync(self, agent: str | None = None, **kwargs: Any) -> Any:
        """A blocking `openai.OpenAI` client for `agent` (for non-async agent code), on a shared pool."""
        from openai import OpenAI

        kwargs.setdefault("http_client", self.client.http_client_sync)
        return OpenAI(base_url=self.base_url, api_key=self.token(agent), **kwargs)

    async def env(self, name: str = "step", data: dict[str, Any] | None = None, agent: str = "") -> None:
        """Record an environment step (observation/action) in the ledger."""
        await self._publish(EnvEvent, name=name, data=dict(data or {}), agent=agent)

    async def reward(self, value: float, agent: str = "", name: str = "reward") -> None:
        """Add a reward; an empty `agent` gives it to every agent of the episode."""
        await self._publish(RewardEvent, value=float(value), agent=agent, name=name)

    async def act(
        self,
        kind: str,
        payload: dict[str, Any] | None = None,
        *,
        cpu: int = 1,
        mem_mb: int = 256,
        accel: int = 0,
        hint_s: float | None = None,
        timeout_s: float | None = None,
        wait_s: float = 600.0,
    ) -> ActionResult:
        """Run one action on the swarm's external resources (the actions service) and wait for it.

        Args:
            kind: `python` (payload {"code": str, "stdin": str}) runs code in a sandbox, or a test
                suite ({"code": str, "cases": [str, ...]}: `code` then each case, one sandbox per
                case, in parallel where units are spare); `judge` (payload {"prompt": str,
                "text": str}) scores text with a model.
            payload: The kind's input (msgpack-able).
            cpu: CPU units the action holds while it runs.
            mem_mb: Memory it may use (enforced).
            accel: Accelerator slots it holds (a judge needs 1).
            hint_s: Your guess of its run time; the scheduler learns its own per kind.
            timeout_s: Wall-clock limit of the run; default: the service's.
            wait_s: How long to wait for the result, queueing included.

        Returns:
            The `ActionResult`: `status` (ok, error, timeout, killed, rejected), `result` (python:
            stdout, stderr, exit_code; a suite: cases, each with those, and passed; judge: score), `error`, and the timings `queued_s`, `run_s`, `act_s`.
            A failed action is a result, not an exception; a service that does not answer in `wait_s`
            raises `nats.errors.TimeoutError`.
        """
        if self.closed:
            raise SwarmError(f"episode {self.episode_id} is already closed")
        self._actions += 1
        request = ActionRequest(
            action_id=f"a{self._actions}", episode_id=self.episode_id, kind=kind, payload=dict(payload or {}),
            cpu=cpu, mem_mb=mem_mb, accel=accel, hint_s=hint_s, timeout_s=timeout_s,
        )  # fmt: skip
        subject = S.act_subject(S.episode_owner(self.episode_id))
        # Asked again every ACT_ASK_S with the same action id, so a restarted actions service (which
        # lost the request) gets it again; a running service answers the repeat with the same result.
        deadline = time.monotonic() + wait_s
        while True:
            left = deadline - time.monotonic()
            try:
                reply = await _retrying(
                    self.client.nc.request, subject, encode(request), timeout=max(min(ACT_ASK_S, left), 0.1),
                    retry_s=self.client.retry_s,
                )  # fmt: skip
                return decode(reply.data, ActionResult)
            except nats.errors.TimeoutError:
                if time.monotonic() >= deadline:
                    raise

    async def end(self, **metrics: float) -> None:
        """Finish the episode; its samples are built from what was published."""
        await self._publish(EndEvent, final=True, metrics={k: float(v) for k, v in metrics.items()})
        await self._stop()

    async def abort(self, reason: str = "") -> None:
        """Give up on the episode; it yields no samples."""
        await self._publish(AbortEvent, final=True, reason=reason[:2000])
        await self._stop()

    async def _stop(self) -> None:
        if self._actions:  # the trajectory is over: a `static` pool frees the units it held for it
            end = ActionRequest(op="end", action_id="end", episode_id=self.episode_id)
            with contextlib.suppress(Exception):  # best effort: the service also frees them on timeout
                await self.client.nc.publish(S.act_subject(S.episode_owner(self.episode_id)), encode(end))
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat

    async def __aenter__(self) -> Episode:
        return await self.begin()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if self.closed:
            return
        if exc is None:
            await self.end()
        else:
            await self.abort(f"{exc_type.__name__ if exc_type else 'error'}: {exc}")
