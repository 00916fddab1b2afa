"""Handcrafted episode events for merger tests: a fake gateway that extends prompts token for token."""

from __future__ import annotations

from typing import Any

from swarmrl.schemas import BeginEvent, LlmEvent, RewardEvent


def begin(episode_id: str = "ep1", **kw: Any) -> BeginEvent:
    fields: dict[str, Any] = {
        "seq": 0,
        "client_id": "agent-proc",
        "client_version": "v7",
        "task_id": "task-1",
    }
    return BeginEvent(episode_id=episode_id, **(fields | kw))


def reward(value: float, agent: str = "", episode_id: str = "ep1", seq: int = 1) -> RewardEvent:
    return RewardEvent(episode_id=episode_id, seq=seq, client_id="agent-proc", value=value, agent=agent)


def logprobs(version: int, n: int) -> list[float]:
    """Distinct, recognisable behaviour logprobs for a call made with `version`."""
    return [-(version + 1) - i / 1000 for i in range(n)]


def llm(
    prompt: list[int],
    output: list[int],
    *,
    version: int = 0,
    agent: str = "a",
    model: str = "m",
    messages: list[dict[str, Any]] | None = None,
    output_text: str = "",
    tools: list[dict[str, Any]] | None = None,
    episode_id: str = "ep1",
    seq: int = 0,
) -> LlmEvent:
    return LlmEvent(
        episode_id=episode_id,
        seq=seq,
        client_id="gateway-test",
        call_id=f"chatcmpl-{seq}",
        agent=agent,
        model=model,
        prompt_ids=prompt,
        output_ids=output,
        output_logprobs=logprobs(version, len(output)),
        policy_version=version,
        messages=messages or [],
        tools=tools or [],
        output_text=output_text,
    )


def chain(
    turns: int, *, agent: str = "a", model: str = "m", episode_id: str = "ep1", base: int = 0
) -> list[LlmEvent]:
    """A multi-turn conversation: call k+1's prompt is call k's prompt + output + a user turn."""
    prompt = [base + 1, base + 2, base + 3]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "play"},
        {"role": "user", "content": "go 0"},
    ]
    calls = []
    for k in range(turns):
        output = [base + 100 + 10 * k + j for j in range(k + 2)]
        text = f"move {k}"
        calls.append(
            llm(prompt, output, version=k, agent=agent, model=model, messages=messages, output_text=text,
                episode_id=episode_id, seq=k)
        )  # fmt: skip
        prompt = [*prompt, *output, base + 50 + k, base + 60 + k]
        messages = [
            *messages,
            {"role": "assistant", "content": text},
            {"role": "user", "content": f"go {k + 1}"},
        ]
    return calls
