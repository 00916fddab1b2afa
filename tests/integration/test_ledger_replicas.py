"""Two ledger replicas share the episode partitions (LEDGER_PARTS) and the other streams by lease;
one stalls past its leases' TTL and wakes up fenced, then one is SIGKILLed mid-run: the other takes
the leases over each time, and every event is recorded exactly once, readable as one ledger through
the usual views."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import nats
from nats.js import JetStreamContext

from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import MergeStats, encode
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.ledger.query import connect
from tests.conftest import wait_for
from tests.integration.test_ledger import interleaved, publish_all, recorded
from tests.integration.test_merger_restart import leases as held_by

LEASES = S.EPISODE_PARTITIONS + 1  # the partitions, and the other streams


def start_replica(server: NatsServer, run_dir: Path, log: Path, replica: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "swarmrl.cli", "serve", "ledger", "--run-dir", str(run_dir),
           "--replica", replica, "--flush-rows", "40", "--flush-interval-s", "0.05", "--fetch-batch", "20",
           "--poll-interval-s", "0.05", "--stop-drain-s", "1"]  # fmt: skip
    env = os.environ | {"SWARMRL_NATS": server.url("ledger")}  # the ledger role's own user
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log.open("ab"), env=env)


async def leases(js: JetStreamContext) -> dict[str, int]:
    return await held_by(js, "ledger")


async def paced(js: JetStreamContext, events: list, per: int = 25, every_s: float = 0.1) -> None:
    for i in range(0, len(events), per):
        await publish_all(js, events[i : i + per])
        await asyncio.sleep(every_s)


def rows_and_distinct(run_dir: Path) -> tuple[int, int]:
    """Rows of events and llm_calls, and how many distinct (episode, client, seq) they hold."""
    keys = "SELECT episode_id, client_id, seq FROM events UNION ALL SELECT episode_id, client_id, seq FROM llm_calls"
    row = (
        connect(run_dir)
        .execute(f"SELECT count(*), count(DISTINCT (episode_id, client_id, seq)) FROM ({keys})")
        .fetchone()
    )
    assert row is not None
    return row[0], row[1]


async def _is(value: object, want: object) -> bool:
    return bool(await value == want)  # type: ignore[misc]


async def test_a_killed_ledger_replica_is_covered_and_nothing_is_lost_or_doubled(
    swarm_nats: NatsServer, tmp_path: Path
) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "ledger.log"
    run_dir.mkdir()
    nc = await nats.connect(swarm_nats.service_url)
    js = nc.jetstream()
    await bus.ensure_streams(js, ledger_parts=True)  # as `up` does for ledger replicas
    events = interleaved(300, "r", window=7)
    stats = [MergeStats(episode_id=f"r{i}", status="merged", calls=1) for i in range(40)]
    more_stats = [MergeStats(episode_id=f"r{i}", status="merged", calls=2) for i in range(40, 80)]
    procs = [start_replica(swarm_nats, run_dir, log, f"l{i}") for i in range(2)]
    try:

        async def shared() -> bool:  # 9 and 8 of the 17 leases
            held = await leases(js)
            return set(held) == {"l0", "l1"} and sorted(held.values()) == [8, 9]

        await wait_for(shared, timeout=30, what="two replicas sharing the leases")
        half = len(events) // 2
        publisher = asyncio.create_task(publish_all(js, events[:half]))
        for s in stats:  # the other streams: MERGE_METRICS rows, recorded by whoever holds lease 16
            await js.publish(S.MERGE_METRICS_SUBJECT, encode(s))
        await wait_for(lambda: recorded(run_dir) >= 200, timeout=30, what="rows written by both")
        # 1. l1 stalls (SIGSTOP) past its leases' TTL, holding unwritten rows: l0 takes its leases;
        # woken, l1 must write none of what it held (fenced) and leave it to l0, then share again.
        procs[1].send_signal(signal.SIGSTOP)
        for s in more_stats:  # the other streams too, while their lease may be the stalled one's
            await js.publish(S.MERGE_METRICS_SUBJECT, encode(s))
        await wait_for(
            lambda: _is(leases(js), {"l0": LEASES}), timeout=60, what="l0 taking the stalled one's leases"
        )
        procs[1].send_signal(signal.SIGCONT)
        await publisher
        await wait_for(shared, timeout=60, what="the two sharing again")
        publisher = asyncio.create_task(paced(js, events[half:]))  # still publishing at the kill
        # 2. l0 is SIGKILLed mid-run: l1 takes everything over
        await wait_for(lambda: recorded(run_dir) >= half + 100, timeout=30, what="rows of the second half")
        procs[0].send_signal(signal.SIGKILL)
        assert procs[0].wait(timeout=10) == -signal.SIGKILL
        at_kill = recorded(run_dir)
        await publisher
        await wait_for(
            lambda: _is(leases(js), {"l1": LEASES}), timeout=30, what="the survivor holding every lease"
        )
        await wait_for(lambda: recorded(run_dir) >= len(events), timeout=60, what=f"every event; log {log}")
        procs[1].send_signal(signal.SIGTERM)
        assert procs[1].wait(timeout=30) == 0
        assert await leases(js) == {}  # a clean stop gives its leases back
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        await nc.close()

    text = log.read_text()
    assert 0 < at_kill < len(events), "the kill must fall mid-run"
    folders = {p.name for p in (run_dir / "ledger" / "events").iterdir() if p.is_dir()}
    assert len(folders) > 1 and all(f.startswith("p") for f in folders)  # partitions' own folders
    con = connect(run_dir)
    total, distinct = rows_and_distinct(run_dir)
    assert total == distinct == len(events), text[-3000:]
    # rows carry EPISODES' own sequence numbers, as with one ledger
    seqs = con.execute(
        "SELECT min(stream_seq), max(stream_seq), count(DISTINCT stream_seq) FROM events"
    ).fetchone()
    assert (
        seqs[1] <= len(events) + len(stats)
        and seqs[2] == con.execute("SELECT count(*) FROM events").fetchone()[0]
    )
    assert con.execute("SELECT count(*) FROM dead_letters").fetchone() == (0,), text[-3000:]
    assert con.execute("SELECT status, count(*), sum(reward) FROM episodes GROUP BY ALL").fetchall() == [
        ("ok", 300, float(sum(range(300))))
    ]
    assert con.execute("SELECT count(*) FROM merges").fetchone() == (len(stats) + len(more_stats),)
    assert "partition" in text and "resuming after EPISODES seq" in text
    assert "stopped: LeaseLost" in text or "stopped: Fenced" in text  # the stalled one was fenced (1.)


async def test_a_replica_whose_partitions_start_while_the_broker_stalls_goes_on(
    swarm_nats: NatsServer, tmp_path: Path
) -> None:
    """The broker stalls (SIGSTOP) just as a replica has taken its leases: every NATS request of its
    partitions' start (consumer lookups, deletes, creates) times out. Those partitions stop and start
    again at a later round; the service does not fail. (CI saw a replica fail so: stalled itself
    past its leases' TTL, it woke with the requests then in flight timed out.)"""
    run_dir, log = tmp_path / "run", tmp_path / "ledger.log"
    run_dir.mkdir()
    nc = await nats.connect(swarm_nats.service_url)
    js = nc.jetstream()
    await bus.ensure_streams(js, ledger_parts=True)
    events = interleaved(40, "s", window=5)
    proc = start_replica(swarm_nats, run_dir, log, "l0")
    assert swarm_nats.proc is not None
    try:
        await wait_for(lambda: log.exists() and "ledger l0: took" in log.read_text(), timeout=60,
                       interval=0.002, what="the replica taking its leases")  # fmt: skip
        swarm_nats.proc.send_signal(signal.SIGSTOP)  # before its partitions' first request
        try:
            await asyncio.sleep(7.0)  # past nats-py's 5 s request timeout
        finally:
            swarm_nats.proc.send_signal(signal.SIGCONT)
        await publish_all(js, events)
        await wait_for(lambda: recorded(run_dir) >= len(events), timeout=60, what=f"every event; log {log}")
        assert await leases(js) == {"l0": LEASES}
        assert proc.poll() is None, log.read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await nc.close()
    assert "stopped: TimeoutError" in log.read_text()  # the stall did fall on the partitions' start
    total, distinct = rows_and_distinct(run_dir)
    assert total == distinct == len(events)
