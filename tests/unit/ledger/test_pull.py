"""How often a caught-up ledger polls a stream (`pull.PollPace`)."""

from __future__ import annotations

import pytest

from swarmrl.services.ledger.pull import PollPace


def test_a_quiet_stream_is_polled_every_poll_interval() -> None:
    pace = PollPace(poll_s=0.25, target=250, now=0.0)
    assert pace.wait(0, now=0.25) == 0.25
    assert pace.wait(3, now=0.5) == 0.25  # a few messages: no hurry
    assert pace.wait(0, now=0.75) == 0.25  # nothing new: the full interval, whatever the rate was


def test_a_busy_stream_is_polled_when_about_target_messages_are_waiting() -> None:
    pace = PollPace(poll_s=0.25, target=250, now=0.0)
    now, wait = 0.0, 0.25
    for _ in range(20):  # 20000 messages a second
        now += wait
        wait = pace.wait(round(20_000 * wait), now)
    assert wait == pytest.approx(250 / 20_000, rel=0.05)
    assert pace.wait(0, now + wait) == 0.25


def test_the_pause_after_a_burst_stays_short() -> None:
    """The fetch after a burst's last messages comes soon (and finds nothing: the ledger writes then)."""
    pace = PollPace(poll_s=0.25, target=250, now=0.0)
    now = 0.0
    for _ in range(10):
        now += 0.0125
        pace.wait(250, now)
    assert pace.wait(10, now + 0.0125) < 0.05
