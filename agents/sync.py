"""A thin blocking wrapper over the async SDK for agents that are not written with asyncio.

    with SyncSwarmClient(nats_url) as swarm:
        with swarm.episode("task-7", models=["policy"]) as ep:
            llm = ep.openai()                                  # openai.OpenAI (blocking)
            llm.chat.completions.create(model="policy", messages=[...])
            ep.reward(1.0)

The async client lives on an event loop in a daemon thread; each call waits for its result.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from swarmrl.agents.sdk import Episode, SwarmClient
from swarmrl.infra.credentials import AgentCredential

T = TypeVar("T")


class SyncSwarmClient:
    """Blocking counterpart of `SwarmClient`; same arguments as `SwarmClient.connect`."""

    def __init__(self, nats_url: AgentCredential | str, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="swarmrl-sdk", daemon=True)
        self._thread.start()
        self.client: SwarmClient = self._run(SwarmClient.connect(nats_url, **kwargs))

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def episode(self, task_id: str, **kwargs: Any) -> SyncEpisode:
        """An episode to use as `with` (begin on enter, end or abort on exit); see `SwarmClient.episode`."""
        return SyncEpisode(self, self.client.episode(task_id, **kwargs))

    def close(self) -> None:
        """Close the connection and stop the background loop."""
        self._run(self.client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def __enter__(self) -> SyncSwarmClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncEpisode:
    """Blocking counterpart of `Episode` (same methods, same arguments)."""

    def __init__(self, owner: SyncSwarmClient, episode: Episode) -> None:
        self._owner = owner
        self.episode = episode

    @property
    def episode_id(self) -> str:
        return self.episode.episode_id

    def begin(self) -> SyncEpisode:
        self._owner._run(self.episode.begin())
        return self

    def openai(self, agent: str | None = None, **kwargs: Any) -> Any:
        return self.episode.openai_sync(agent, **kwargs)

    def env(self, name: str = "step", data: dict[str, Any] | None = None, agent: str = "") -> None:
        self._owner._run(self.episode.env(name, data, agent))

    def reward(self, value: float, agent: str = "", name: str = "reward") -> None:
        self._owner._run(self.episode.reward(value, agent, name))

    def end(self, **metrics: float) -> None:
        self._owner._run(self.episode.end(**metrics))

    def abort(self, reason: str = "") -> None:
        self._owner._run(self.episode.abort(reason))

    def __enter__(self) -> SyncEpisode:
        return self.begin()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self._owner._run(self.episode.__aexit__(exc_type, exc, tb))
