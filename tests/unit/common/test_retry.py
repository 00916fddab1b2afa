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


async def test_a_publish_still_in_process_is_tried_again_and_other_api_errors_are_not() -> None:
    import nats.js.errors

    from swarmrl.services.common.retry import DUPLICATE_IN_PROCESS, within

    calls: list[int] = []

    async def publish() -> str:
        calls.append(1)
        if len(calls) < 3:  # the earlier try's ack timed out; it is still being stored
            raise nats.js.errors.APIError(
                code=409, err_code=DUPLICATE_IN_PROCESS, description="duplicate message id is in process"
            )
        return "ack"

    assert await within(10, publish) == "ack" and len(calls) == 3
    assert await retry(asyncio.Event(), publish) == "ack"

    async def refused() -> None:
        raise nats.js.errors.APIError(code=400, err_code=10060, description="stream not found")

    with pytest.raises(nats.js.errors.APIError):
        await within(10, refused)
