"""What became of each group (pure logic): one `GroupOutcome` per formed or dropped group and owner,
published on `swarm.metrics.outcome.<owner>.<model>` with a msg id of the group's episode ids (so a
replayed decision is stored once), and a warning, once per client, when most of its groups are dropped.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections import Counter

from swarmrl.schemas import OUTCOME_REASONS, GroupOutcome
from swarmrl.schemas import subjects as S
from swarmrl.services.trainer.grouping import Held

WARN_AFTER_GROUPS = 8
"""A client's outcomes counted before the trainer judges whether most of its groups are dropped."""


class Outcomes:
    def __init__(self, model: str) -> None:
        self.model = model
        self.pending: list[tuple[str, GroupOutcome, str]] = []  # (subject, record, msg id) not yet published
        self.by_client: dict[str, Counter[str]] = {}
        """client id -> how many of its groups were trained, and dropped per reason."""
        self.warned: set[str] = set()

    def trained(self, key: str, items: list[Held], step: int) -> None:
        self._add(key, items, "trained", "", step)

    def dropped(self, key: str, items: list[Held], reason: str, step: int) -> None:
        if items:
            self._add(key, items, "dropped", reason, step)

    def take(self) -> list[tuple[str, GroupOutcome, str]]:
        pending, self.pending = self.pending, []
        return pending

    def warnings(self) -> list[str]:
        """For each client not warned yet with `WARN_AFTER_GROUPS` outcomes, most of them drops: why."""
        out = []
        for client, counts in self.by_client.items():
            total = sum(counts.values())
            dropped = total - counts["trained"]
            if client in self.warned or total < WARN_AFTER_GROUPS or dropped * 2 <= total:
                continue
            self.warned.add(client)
            reason, n = Counter({r: c for r, c in counts.items() if r != "trained"}).most_common(1)[0]
            out.append(
                f"{dropped} of the {total} groups of client {client!r} were dropped untrained, {n} of them "
                f"{reason}: {OUTCOME_REASONS.get(reason, reason)} "
                "(`SwarmClient.outcome`, the ledger's `groups`)"
            )
        return out

    def _add(self, key: str, items: list[Held], outcome: str, reason: str, step: int) -> None:
        by_owner: dict[str, list[Held]] = {}
        for h in items:
            try:
                by_owner.setdefault(S.episode_owner(h.sample.episode_id), []).append(h)
            except ValueError:  # an episode id of no owner (a service's): nobody to tell
                continue
        for owner, held in by_owner.items():
            samples = [h.sample for h in held]
            try:
                std = statistics.pstdev([s.reward for s in samples])
            except OverflowError:
                std = math.inf
            episodes = sorted({s.episode_id for s in samples})
            record = GroupOutcome(
                model=self.model, owner=owner, group_key=key, task=samples[0].task,
                client_id=samples[0].client_id, outcome=outcome, reason=reason,  # type: ignore[arg-type]
                step=step, reward_std=std if math.isfinite(std) else 0.0, episodes=len(episodes),
            )  # fmt: skip
            digest = hashlib.sha1("\n".join(episodes).encode()).hexdigest()[:16]
            self.pending.append(
                (S.outcome_subject(owner, self.model), record, f"outcome-{self.model}-{digest}")
            )
            self.by_client.setdefault(record.client_id, Counter())[reason or "trained"] += 1
