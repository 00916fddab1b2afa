"""`retry` and `backoff`: transient failures are waited out, anything else propagates, a stop, the
tries or the seconds end the wait."""

from __future__ import annotations

import asyncio

import nats.errors
import nats.js.errors
import pytest

from swarmrl.services.common.retry import DUPLICATE_IN_PROCESS, Stopping, backoff, retry


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


async def test_backoff_gives_up_after_its_tries_and_lets_the_last_failure_through() -> None:
    calls: list[int] = []

    async def refused() -> None:
        calls.append(1)
        raise ConnectionError(f"refused {len(calls)}")

    with pytest.raises(ConnectionError, match="refused 3"):
        await backoff(refused, transient=(ConnectionError,), tries=3, first_s=0.01)
    assert calls == [1, 1, 1]


async def test_backoff_gives_up_after_its_seconds_and_returns_what_the_action_returns() -> None:
    calls: list[int] = []

    async def down() -> str:
        calls.append(1)
        raise nats.errors.TimeoutError

    with pytest.raises(nats.errors.TimeoutError):
        await backoff(down, seconds=0.2, first_s=0.05, max_s=0.05)
    assert 2 <= len(calls)  # tried again within the time, then gave up

    async def up() -> str:
        return "ok"

    assert await backoff(up, tries=1) == "ok"


async def test_a_publish_still_in_process_is_tried_again_and_other_api_errors_are_not() -> None:
    calls: list[int] = []

    async def publish() -> str:
        calls.append(1)
        if len(calls) < 3:  # the earlier try's ack timed out; it is still being stored
            raise nats.js.errors.APIError(
                code=409, err_code=DUPLICATE_IN_PROCESS, description="duplicate message id is in process"
            )
        return "ack"

    assert await backoff(publish, seconds=10) == "ack" and len(calls) == 3
    assert await retry(asyncio.Event(), publish) == "ack"

    async def refused() -> None:
        raise nats.js.errors.APIError(code=400, err_code=10060, description="stream not found")

    with pytest.raises(nats.js.errors.APIError):
        await backoff(refused, seconds=10)
