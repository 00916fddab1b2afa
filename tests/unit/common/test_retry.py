"""`retry`: transient NATS failures are waited out, anything else propagates, a stop ends the wait."""

from __future__ import annotations

import asyncio

import nats.errors
import pytest

from swarmrl.services.common.retry import Stopping, retry


async def test_transient_failures_are_retried_until_the_action_succeeds() -> None:
    calls: list[int] = []

    async def flaky(n: int) -> None:
        calls.append(n)
        if len(calls) < 3:
            raise nats.errors.TimeoutError

    await retry(asyncio.Event(), flaky, 7)
    assert calls == [7, 7, 7]


async def test_other_failures_propagate_at_once() -> None:
    calls: list[int] = []

    async def broken() -> None:
        calls.append(1)
        raise ValueError("rejected")

    with pytest.raises(ValueError, match="rejected"):
        await retry(asyncio.Event(), broken)
    assert calls == [1]


async def test_a_stop_request_turns_the_wait_into_stopping() -> None:
    stop = asyncio.Event()
    calls: list[int] = []

    async def down() -> None:
        calls.append(1)
        if len(calls) == 2:
            stop.set()
        raise nats.errors.NoRespondersError

    with pytest.raises(Stopping):
        await retry(stop, down)
    assert calls == [1, 1]
