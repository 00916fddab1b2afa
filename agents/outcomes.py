"""What became of an agent's groups: the `GroupOutcome`s its trainers send it, kept for `outcome()`.

Subscribed (`swarm.metrics.outcome.<owner>.*`) when the client connects, so an outcome decided while
the agent plays on is kept until it asks for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from swarmrl.schemas import OUTCOME_REASONS, GroupOutcome, WireError, decode
from swarmrl.schemas import subjects as S

log = logging.getLogger("swarmrl.sdk")

KEEP = 10_000
"""Groups whose outcomes a client keeps (oldest forgotten first)."""


class OutcomeBook:
    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.by_group: OrderedDict[str, dict[str, GroupOutcome]] = OrderedDict()
        self.changed = asyncio.Event()
        self.sub: Subscription | None = None

    async def watch(self, nc: NATS) -> None:
        """Subscribe once to this owner's outcomes (of every model)."""
        if self.sub is None:
            self.sub = await nc.subscribe(f"{S.OUTCOME_PREFIX}.{S.check_owner(self.owner)}.*", cb=self._on)

    def add(self, outcome: GroupOutcome) -> None:
        self.by_group.setdefault(outcome.group_key, {})[outcome.model] = outcome
        self.by_group.move_to_end(outcome.group_key)
        while len(self.by_group) > KEEP:
            self.by_group.popitem(last=False)
        self.changed.set()
        self.changed = asyncio.Event()

    async def _on(self, msg: Msg) -> None:
        try:
            self.add(decode(msg.data, GroupOutcome))
        except WireError as exc:
            log.warning("outcome on %s not understood: %s", msg.subject, exc)

    async def wait(self, group_key: str, model: str | None, timeout: float) -> GroupOutcome:
        try:
            async with asyncio.timeout(timeout):
                while True:
                    got = self.by_group.get(group_key, {})
                    if (found := got.get(model) if model else next(iter(got.values()), None)) is not None:
                        return found
                    await self.changed.wait()  # `add` sets it, then puts a fresh one in its place
        except TimeoutError:
            raise TimeoutError(
                f"no outcome of group {group_key!r}{f' for model {model!r}' if model else ''} within "
                f"{timeout:g}s: the trainer decides when the group is complete (all its episodes ended) "
                "and, to train it, at its next step"
            ) from None


def describe(outcome: GroupOutcome) -> str:
    """One line for a person: `trained at step 3 (reward std 0.50)` or `dropped: zero_adv (...)`."""
    if outcome.outcome == "trained":
        return f"trained at step {outcome.step} (reward std {outcome.reward_std:.3g})"
    return f"dropped: {outcome.reason} ({OUTCOME_REASONS.get(outcome.reason, outcome.reason)})"
