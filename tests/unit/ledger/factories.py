"""Episode events for the ledger tests: a complete episode as an agent and the gateway would publish it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from swarmrl.schemas import BeginEvent, EndEvent, EnvEvent, Event, LlmEvent, RewardEvent, TrainStep
from swarmrl.services.ledger.columns import to_arrow
from swarmrl.services.ledger.store import PartWriter
from swarmrl.services.ledger.tables import dead_letter_row


def episode(
    episode_id: str, *, reward: float = 1.0, client: str = "agent-1", calls: int = 1, end: bool = True
) -> list[Event]:
    """begin, `calls` llm calls (from the gateway), one env step, one reward and (optionally) end."""
    events: list[Event] = [
        BeginEvent(
            episode_id=episode_id,
            seq=0,
            client_id=client,
            client_version="v1",
            task_id="arith-3",
            task={"name": "arith", "n": 3},
            models=["policy"],
            agents=["solver"],
        ),
    ]
    for i in range(calls):
        events.append(
            LlmEvent(
                episode_id=episode_id,
                seq=i,
                client_id="gateway-x",
                call_id=f"chatcmpl-{episode_id}-{i}",
                agent="solver",
                model="policy",
                prompt_ids=[1, 2, 3 + i],
                output_ids=[7, 8, 2**40],
                output_logprobs=[-0.5, -0.25, -0.125],
                policy_version=3,
                messages=[{"role": "user", "content": "2+2?"}],
                output_text="4",
            )
        )
    events.append(EnvEvent(episode_id=episode_id, seq=1, client_id=client, name="answer", data={"ok": True}))
    events.append(RewardEvent(episode_id=episode_id, seq=2, client_id=client, value=reward))
    if end:
        events.append(EndEvent(episode_id=episode_id, seq=3, client_id=client, metrics={"turns": 1.0}))
    return events


def train_step(**fields: Any) -> TrainStep:
    """A valid TrainStep of model `policy`; pass the fields a test looks at."""
    base: dict[str, Any] = {
        "model": "policy",
        "step": 1,
        "policy_version": 1,
        "loss": 0.0,
        "reward_mean": 0.0,
        "reward_std": 0.0,
        "samples": 1,
        "tokens": 1,
        "trained_tokens": 1,
        "tokens_per_s": 1.0,
        "staleness_mean": 0.0,
        "staleness_max": 0,
        "wall_s": 1.0,
    }
    return TrainStep(**(base | fields))


def dead_letter_run(run_dir: Path) -> Path:
    """One dead letter in `run_dir`'s ledger, as the ledger service writes it."""
    writer = PartWriter(run_dir)
    writer.prepare()
    row = dead_letter_row(
        subject="swarm.dlq.merger",
        data=b"\xc1\x00",
        service="merger",
        original_subject="swarm.ep.e1.env",
        reason="malformed: not msgpack",
        ts=1.0,
        stream="DLQ",
        seq=1,
    )
    writer.write_group({"dead_letters": to_arrow("dead_letters", [row])})
    return run_dir
