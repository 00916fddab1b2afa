"""GRPO group formation (pure logic): samples in, ready groups and dropped samples out.

Samples are keyed by `group_key`, then by episode. An episode is complete once every agent seen in it
delivered all `n_samples` of its samples (counted per agent and model by the merger).

- A group's size is what its client declared on `begin`, else `num_repeat`; a sample declaring
  another size than its group's is refused (`mismatch`), not re-sliced.
- A group is ready once it holds its size of complete episodes; the oldest that many are emitted, the
  rest start the next group of the key.
- A group not ready `timeout_s` after its oldest sample is flushed: emitted as partial with at least
  `min_group_size` complete episodes, else dropped; its incomplete episodes are always dropped.
- A redelivered sample replaces the handle it was held with; it never counts twice.
- An episode that will never deliver (a `LostEpisode` record: `note_lost`, or a stale sample of it:
  `discard`) counts towards its group's size, so the group is emitted (or dropped, if too few are
  complete) without waiting for the timeout; the records' handles go with the group (`Group.lost`).
  A record whose group has no pending episode is acked after `hold_s` (held longer, it counts as
  backlog for admission control) and its credit kept until `timeout_s`.

Every sample is held with an opaque `handle` (its message's key, `intake.py`); a handle this buffer
lets go of is returned, or left in `spent`.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

from swarmrl.schemas import Sample


@dataclass
class Held:
    """A sample waiting to be trained, with the handle that acks it."""

    sample: Sample
    handle: Any
    received: float


@dataclass
class Credit:
    """A lost episode not yet counted out of a group, with the handle that acks its record."""

    episode_id: str
    handle: Any
    arrived: float


@dataclass
class Stall:
    """A group waiting for episodes that have not come (see `GroupBuffer.stalled`)."""

    key: str
    episodes: int
    size: int
    lost: int
    clients: list[str]


@dataclass
class Episode:
    episode_id: str
    first_seen: float
    agents: dict[str, dict[int, Held]] = field(default_factory=dict)  # agent -> index -> sample

    def complete(self) -> bool:
        """Every agent seen has all its samples: as many as the most any of them declares."""
        return all(
            len(by_index) >= max(h.sample.n_samples for h in by_index.values())
            for by_index in self.agents.values()
        )

    def items(self) -> list[Held]:
        return [h for agent in sorted(self.agents) for _, h in sorted(self.agents[agent].items())]


@dataclass
class Group:
    """Samples of complete episodes of one group key, ready for advantages."""

    key: str
    items: list[Held]
    partial: bool = False  # emitted by the timeout with fewer than `num_repeat` episodes
    lost: list[Any] = field(default_factory=list)
    """Handles of the lost-episode records this group counted out: acked with its samples."""

    @property
    def episodes(self) -> int:
        return len({h.sample.episode_id for h in self.items})


class GroupBuffer:
    def __init__(
        self,
        num_repeat: int,
        timeout_s: float,
        min_group_size: int,
        counts: Counter[str] | None = None,
        hold_s: float = 10.0,
    ) -> None:
        self.num_repeat = num_repeat
        self.timeout_s = timeout_s
        self.hold_s = min(hold_s, timeout_s)
        self.min_group_size = min_group_size
        self.pending: dict[str, dict[str, Episode]] = {}  # group_key -> episode_id -> Episode
        self.held: dict[tuple[str, str, int], str] = {}  # (episode, agent, index) -> group_key
        self.sizes: dict[str, int] = {}  # group_key -> its size, while it has pending episodes
        self.counts: Counter[str] = Counter() if counts is None else counts
        self.lost: dict[str, list[Credit]] = {}  # group_key -> lost episodes not yet counted out
        self.credits: dict[str, Credit] = {}  # episode_id -> its credit, while unused
        self.gone: OrderedDict[str, None] = OrderedDict()  # episodes lost or discarded, newest last
        self.max_gone = 100_000
        self.warned: set[str] = set()  # group keys already reported by `stalled`
        self.dropped_groups: list[tuple[str, list[Held], str]] = []
        """(key, samples, reason) of each group dropped whole, for its owner's outcome."""
        self.spent: list[Any] = []  # handles of lost records no group will use: the caller acks them

    def note_lost(self, group_key: str, episode_id: str, handle: Any = None, now: float = 0.0) -> list[Any]:
        """Episode `episode_id` of `group_key` will never deliver samples; `handle` acks its record.
        Returns the handle of an earlier copy it replaces."""
        if (credit := self.credits.get(episode_id)) is not None:  # a copy held: keep the newest
            replaced, credit.handle = credit.handle, handle
            return [replaced] if replaced is not None and replaced != handle else []
        if episode_id in self.gone:  # counted before (and used, or discarded here): nothing to add
            if handle is not None:
                self.spent.append(handle)
            return []
        self.gone[episode_id] = None
        while len(self.gone) > self.max_gone:
            self.gone.popitem(last=False)
        self.credits[episode_id] = credit = Credit(episode_id, handle, now)
        self.lost.setdefault(group_key, []).append(credit)
        self.counts["lost_episodes"] += 1
        return []

    def discard(self, sample: Sample, now: float = 0.0) -> list[Held]:
        """`sample` will not be trained: its whole episode is lost to its group. Returns the
        episode's samples held so far, which the caller drops with it."""
        episode = sample.episode_id
        if episode in self.gone:
            return []
        self.note_lost(sample.group_key, episode, now=now)
        held = self.pending.get(sample.group_key, {}).get(episode)
        return self._release(sample.group_key, [held]) if held is not None else []

    def is_discarded(self, sample: Sample) -> bool:
        """Whether `sample`'s episode was discarded or reported lost: it is dropped on arrival."""
        return sample.episode_id in self.gone

    def lost_handles(self) -> list[Any]:
        return [c.handle for credits in self.lost.values() for c in credits if c.handle is not None]

    def size(self, sample: Sample) -> int:
        """The group size `sample` declares: its client's, else this trainer's `num_repeat`."""
        return sample.group_size or self.num_repeat

    def mismatch(self, sample: Sample) -> str | None:
        """Why `sample` cannot join its group (a dead-letter reason), or None."""
        size, held = self.size(sample), self.sizes.get(sample.group_key)
        if held is None or held == size:
            return None
        return (
            f"group_size: episode {sample.episode_id} declares {size} episodes for group "
            f"{sample.group_key!r}, whose other episodes declared {held}"
        )

    def __len__(self) -> int:
        """Samples held (not yet emitted or dropped)."""
        return len(self.held)

    def add(self, sample: Sample, handle: Any, now: float) -> list[Any]:
        """Hold `sample`; returns the handle of an earlier copy of it that this one replaces."""
        slot = (sample.episode_id, sample.agent, sample.index)
        key = self.held.get(slot)
        if key is not None:  # a copy held: keep the newest handle, the sample is the same
            self.counts["duplicate_samples"] += 1
            held = self.pending[key][sample.episode_id].agents[sample.agent][sample.index]
            replaced, held.handle = held.handle, handle
            return [replaced] if replaced != handle else []
        episodes = self.pending.setdefault(sample.group_key, {})
        self.sizes.setdefault(sample.group_key, self.size(sample))
        episode = episodes.setdefault(sample.episode_id, Episode(sample.episode_id, first_seen=now))
        episode.agents.setdefault(sample.agent, {})[sample.index] = Held(sample, handle, now)
        self.held[slot] = sample.group_key
        return []

    def pop_ready(self, now: float) -> tuple[list[Group], list[Held]]:
        """Groups ready to train, and samples that will never be trained (the caller acks them)."""
        ready: list[Group] = []
        dropped: list[Held] = []
        for key in list(self.pending):
            episodes, size = self.pending[key], self.sizes[key]
            complete = [ep for ep in episodes.values() if ep.complete()]  # dicts keep arrival order
            while len(complete) >= size:
                take, complete = complete[:size], complete[size:]
                ready.append(Group(key, self._release(key, take)))
            if complete and len(complete) + len(self.lost.get(key, [])) >= size:
                used = self._use_credits(key, size - len(complete))
                if len(complete) >= self.min_group_size:
                    self.counts["short_groups"] += 1
                    ready.append(Group(key, self._release(key, complete), partial=True, lost=used))
                else:  # too few left to have a baseline, and no more are coming
                    self.counts["lost_dropped_groups"] += 1
                    lost_dropped = self._release(key, complete)
                    self.counts["lost_dropped_samples"] += len(lost_dropped)
                    self.dropped_groups.append((key, lost_dropped, "failed_episodes"))
                    dropped.extend(lost_dropped)
                    self.spent += used
                complete = []
            if not episodes:
                del self.pending[key], self.sizes[key]
                continue
            oldest = min(ep.first_seen for ep in episodes.values())
            if now - oldest < self.timeout_s:
                continue
            incomplete = [ep for ep in episodes.values() if not ep.complete()]
            timed_out = self._release(key, incomplete)
            if len(complete) >= self.min_group_size:
                self.counts["partial_groups"] += 1
                ready.append(Group(key, self._release(key, complete), partial=True))
            else:
                self.counts["timeout_dropped_groups"] += 1
                timed_out += self._release(key, complete)
                self.dropped_groups.append((key, timed_out, "timeout"))
            del self.pending[key], self.sizes[key]
            self.counts["timeout_dropped_samples"] += len(timed_out)
            dropped.extend(timed_out)
        self._expire_credits(now)
        return ready, dropped

    def stalled(self, now: float, after_s: float) -> list[Stall]:
        """Groups short of their size with no new episode for `after_s`, each once."""
        out = []
        self.warned &= set(self.pending)
        for key, episodes in self.pending.items():
            if key in self.warned or now - max(ep.first_seen for ep in episodes.values()) < after_s:
                continue
            self.warned.add(key)
            clients = sorted({h.sample.client_id for ep in episodes.values() for h in ep.items()})
            out.append(Stall(key, len(episodes), self.sizes[key], len(self.lost.get(key, [])), clients))
        return out

    def _use_credits(self, key: str, n: int) -> list[Any]:
        """Count `n` lost episodes of `key` out; returns their records' handles."""
        credits = self.lost.pop(key)
        used, left = credits[:n], credits[n:]
        if left:
            self.lost[key] = left
        for c in used:
            del self.credits[c.episode_id]
        return [c.handle for c in used if c.handle is not None]

    def _expire_credits(self, now: float) -> None:
        """For keys without a pending episode: ack their records after `hold_s` (the credit stays),
        and forget their credits after `timeout_s`."""
        for key in [k for k in self.lost if k not in self.pending]:
            credits = self.lost[key]
            for c in credits:
                if c.handle is not None and now - c.arrived >= self.hold_s:
                    self.spent.append(c.handle)
                    c.handle = None
            if now - credits[-1].arrived >= self.timeout_s:
                for c in self.lost.pop(key):
                    del self.credits[c.episode_id]

    def _release(self, key: str, episodes: list[Episode]) -> list[Held]:
        out: list[Held] = []
        for ep in episodes:
            del self.pending[key][ep.episode_id]
            for h in ep.items():
                del self.held[(h.sample.episode_id, h.sample.agent, h.sample.index)]
                out.append(h)
        return out

    def take_dropped_groups(self) -> list[tuple[str, list[Held], str]]:
        dropped, self.dropped_groups = self.dropped_groups, []
        return dropped

    def take_spent(self) -> list[Any]:
        spent, self.spent = self.spent, []
        return spent
