"""One episode of an agent: its signed API tokens, its events, its actions and its heartbeats.

Tokens come from the gateway (`swarm.auth.token.<owner>`), actions from the actions service
(`swarm.act.<owner>`). Made by `SwarmClient.episode()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

import nats
from pydantic import ValidationError

from swarmrl.schemas import (
    AbortEvent,
    ActionRequest,
    ActionResult,
    BeginEvent,
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
from swarmrl.services.common.retry import TRANSIENT as RETRY_TRANSIENT
from swarmrl.services.common.retry import backoff

if TYPE_CHECKING:
    from swarmrl.agents.sdk import SwarmClient

log = logging.getLogger("swarmrl.sdk")

TRANSIENT = (*RETRY_TRANSIENT, nats.errors.OutboundBufferLimitError)
"""What the SDK retries for its `retry_s`: the services' transient failures and a full outbound buffer."""

ACT_ASK_S = 30.0
"""`Episode.act` repeats its request this often until the result comes (the same action id)."""


class SwarmError(RuntimeError):
    """The swarm refused a request (e.g. the gateway would not mint a token); the message says why."""


async def retried(retry_s: float, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` through the SDK's `TRANSIENT` failures for up to `retry_s` seconds."""
    return await backoff(functools.partial(fn, *args, **kwargs), transient=TRANSIENT, seconds=retry_s)


class Episode:
    """One episode's lifecycle, not yet begun; use it as `async with` (begin on enter, end or abort on
    exit). Its events are numbered from 0 (begin).

    Args:
        task_id: Task identity.
        models: Models the episode may call; default: the union of `agent_models`.
        agents: Agent names (one token each); default: the keys of `agent_models`, else `["agent"]`.
        agent_models: Per agent, the models its token may call; an agent not listed may call all.
        group_key: GRPO group; default: `task_id`.
        group_size: Episodes this client plays in the group; 0: the trainer's `num_repeat`.
        task: Free-form description for the ledger; its `"name"` is what task mixing weighs.
        eval: Evaluation episode: recorded, never trained on.
        episode_id: `<owner>` or `<owner>_<suffix>`; default: `<owner>_<random>`.
        heartbeat_s: Heartbeat period (0 disables).
        token_ttl_s: Lifetime of the episode's API tokens.
    """

    def __init__(
        self,
        client: SwarmClient,
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
    ) -> None:
        per_agent = {str(a): list(ms) for a, ms in (agent_models or {}).items()}
        episode_id = episode_id or S.new_episode_id(client.state_key, uuid.uuid4().hex)
        if client.owner and S.episode_owner(episode_id) != client.owner:
            raise SwarmError(
                f"episode id {episode_id!r} is not this client's: its ids are {client.owner!r} or "
                f"'{client.owner}_<suffix>' (the server refuses events for any other)"
            )
        self.client = client
        self.episode_id = episode_id
        self.task_id, self.agent_models = task_id, per_agent
        self.models = list(models or dict.fromkeys(m for ms in per_agent.values() for m in ms))
        self.agents = list(agents or per_agent or ["agent"])
        self.group_key, self.group_size, self.task, self.eval = group_key, group_size, dict(task or {}), eval
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
        subject = S.token_subject(S.episode_owner(self.episode_id))
        while True:
            answer = decode((await self._request(subject, request, 10.0)).data, TokenReply)
            if answer.retry_after_s is None:  # else admission control or task mixing says wait
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

    async def _request(self, subject: str, request: TokenRequest | ActionRequest, timeout: float) -> Any:
        return await retried(
            self.client.retry_s, self.client.nc.request, subject, encode(request), timeout=timeout
        )

    async def _beat(self) -> None:
        while not self.closed:
            await asyncio.sleep(self.heartbeat_s)
            try:
                await self._publish(HeartbeatEvent)
            except SwarmError:
                return
            except Exception as exc:  # a missed heartbeat must never end the beat (nor the agent)
                log.warning("heartbeat failed for episode %s: %s", self.episode_id, exc)

    def token(self, agent: str | None = None) -> str:
        """The signed API token of `agent` (default: the first agent)."""
        agent = agent or self.agents[0]
        if agent not in self.tokens:
            raise SwarmError(f"no token for agent {agent!r}; episode agents are {self.agents}")
        return self.tokens[agent]

    def openai(self, agent: str | None = None, **kwargs: Any) -> Any:
        """An `openai.AsyncOpenAI` client for `agent` with this episode's token, on the swarm client's
        shared connection pool (unless `http_client=` is given)."""
        from openai import AsyncOpenAI

        kwargs.setdefault("http_client", self.client.http_client)
        return AsyncOpenAI(base_url=self.base_url, api_key=self.token(agent), **kwargs)

    def openai_sync(self, agent: str | None = None, **kwargs: Any) -> Any:
        """A blocking `openai.OpenAI` client for `agent`, on a shared pool."""
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
        """Run one action through the actions service and wait for its `ActionResult`.

        Args:
            kind: `python` runs `{"code", "stdin"}` in a sandbox, or a test suite `{"code", "cases"}`
                (one sandbox per case); `judge` scores `{"prompt", "text"}` with a model.
            payload: The kind's input (msgpack-able).
            cpu: CPU units held while it runs.
            mem_mb: Memory it may use (enforced).
            accel: Accelerator slots held (a judge needs 1).
            hint_s: Your guess of its run time; the scheduler learns its own per kind.
            timeout_s: Wall-clock limit of the run; default: the service's.
            wait_s: How long to wait for the result, queueing included; then `nats.errors.TimeoutError`.

        A failed action is a result (`status` error, timeout, killed or rejected), not an exception.
        """
        if self.closed:
            raise SwarmError(f"episode {self.episode_id} is already closed")
        self._actions += 1
        request = ActionRequest(
            action_id=f"a{self._actions}", episode_id=self.episode_id, kind=kind, payload=dict(payload or {}),
            cpu=cpu, mem_mb=mem_mb, accel=accel, hint_s=hint_s, timeout_s=timeout_s,
        )  # fmt: skip
        subject = S.act_subject(S.episode_owner(self.episode_id))
        # Asked again every ACT_ASK_S with the same id: a restarted service gets it again.
        deadline = time.monotonic() + wait_s
        while True:
            timeout = max(min(ACT_ASK_S, deadline - time.monotonic()), 0.1)
            try:
                return decode((await self._request(subject, request, timeout)).data, ActionResult)
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
            with contextlib.suppress(nats.errors.Error):  # the service also frees them on timeout
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
