"""`until_stopped`: a service returns on stop and fails loudly when one of its loops dies; `Background`
keeps the tasks a service does not await until they end, and cancels the rest on close."""

from __future__ import annotations

import asyncio

import pytest

from swarmrl.services.common.tasks import Background, until_stopped


async def test_returns_when_stop_is_set() -> None:
    stop = asyncio.Event()
    loop = asyncio.create_task(asyncio.sleep(60))
    asyncio.get_running_loop().call_later(0.05, stop.set)
    await asyncio.wait_for(until_stopped(stop, [loop]), 5)
    assert not loop.done()
    loop.cancel()


async def test_a_failed_loop_raises_sets_stop_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def boom() -> None:
        raise ValueError("consumer died")

    stop = asyncio.Event()
    with pytest.raises(ValueError, match="consumer died"), caplog.at_level("ERROR", logger="swarmrl.tasks"):
        await asyncio.wait_for(until_stopped(stop, [asyncio.create_task(boom(), name="consumer")]), 5)
    assert stop.is_set()
    assert "consumer failed: stopping the service" in caplog.text and "consumer died" in caplog.text


async def test_a_loop_that_returns_early_is_a_failure_too() -> None:
    stop = asyncio.Event()
    quiet = asyncio.create_task(asyncio.sleep(0), name="watcher")
    with pytest.raises(RuntimeError, match="watcher ended unexpectedly"):
        await asyncio.wait_for(until_stopped(stop, [quiet]), 5)


async def test_a_loop_that_returns_because_of_the_stop_is_no_failure() -> None:
    """The race the ledger lost under load: a loop sees the stop and returns in the same instant."""
    stop = asyncio.Event()

    async def loop() -> None:
        await stop.wait()

    task = asyncio.create_task(loop(), name="ledger-METRICS")
    await asyncio.sleep(0)  # the loop waits on the event, as the stopper will
    stop.set()
    await asyncio.wait_for(until_stopped(stop, [task]), 5)


async def test_background_keeps_tasks_until_they_end_and_cancels_the_rest_on_close() -> None:
    background = Background()
    quick = background.spawn(asyncio.sleep(0))
    slow = background.spawn(asyncio.sleep(60))
    assert len(background) == 2
    await quick
    await asyncio.sleep(0)  # the done callback runs on the next turn of the loop
    assert len(background) == 1
    await asyncio.wait_for(background.close(), 5)
    assert slow.cancelled()
    assert len(background) == 0
