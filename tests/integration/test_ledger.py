"""The ledger against a real nats-server and real Parquet/DuckDB: recording, bad input, kill and restart."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import duckdb
import msgpack
import nats
import pytest
from nats.js import JetStreamContext

from swarmrl.infra.nats_server import NatsServer
from swarmrl.schemas import MAX_EVENT_BYTES, EvalResult, Event, MergeStats, Sample, encode
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.ledger.config import LedgerConfig
from swarmrl.services.ledger.query import connect
from swarmrl.services.ledger.service import Ledger
from tests.conftest import wait_for
from tests.unit.ledger.factories import episode, train_step


async def publish(js: JetStreamContext, ev: Event, msg_id: str | None = None) -> None:
    subject = S.episode_subject(ev.episode_id, ev.kind)
    await js.publish(subject, encode(ev), headers={"Nats-Msg-Id": msg_id or ev.msg_id})


async def publish_all(js: JetStreamContext, events: list[Event]) -> None:
    for ev in events:  # in order: a begin must be stored before the events of its episode
        await publish(js, ev)


def count(run_dir: Path, sql: str) -> int:
    with connect(run_dir) as con:
        return int(con.execute(sql).fetchone()[0])


@pytest.fixture
async def ledger(swarm_nats: NatsServer, tmp_path: Path) -> AsyncIterator[Ledger]:
    cfg = LedgerConfig(
        nats=swarm_nats.service_url, run_dir=tmp_path / "run", flush_interval_s=0.05, poll_interval_s=0.05
    )
    service = Ledger(cfg)
    await service.start()
    yield service
    await service.stop()


async def test_events_samples_and_metrics_are_queryable(js: JetStreamContext, ledger: Ledger) -> None:
    published = episode("ok1", reward=0.75, calls=2) + episode("open1", end=False)
    for ev in published:
        await publish(js, ev)
    sample = Sample(
        sample_id="ok1.solver.0",
        model="policy",
        episode_id="ok1",
        agent="solver",
        task_id="arith-3",
        group_key="arith-3",
        token_ids=[1, 2, 7],
        loss_mask=[0, 0, 1],
        logprobs=[0.0, 0.0, -0.5],
        policy_versions=[-1, -1, 3],
        reward=0.75,
    )
    await js.publish(S.samples_subject("policy"), encode(sample), headers={"Nats-Msg-Id": sample.sample_id})
    step = train_step(
        policy_version=4,
        loss=0.5,
        reward_mean=0.75,
        tokens=3,
        tokens_per_s=9.0,
        staleness_mean=1.0,
        staleness_max=1,
        wall_s=0.3,
    )
    await js.publish(S.train_metrics_subject("policy"), encode(step), headers={"Nats-Msg-Id": "train.1"})
    await js.publish(
        S.eval_metrics_subject("policy"),
        encode(EvalResult(model="policy", step=1, task="arith", success_rate=0.5, n=4)),
    )
    await js.publish(S.MERGE_METRICS_SUBJECT, encode(MergeStats(episode_id="ok1", status="merged", calls=2)))

    run_dir = ledger.cfg.run_dir
    await wait_for(
        lambda: (
            count(
                run_dir,
                "SELECT (SELECT count(*) FROM events) + (SELECT count(*) FROM llm_calls)"
                " + (SELECT count(*) FROM samples) + (SELECT count(*) FROM train_steps)"
                " + (SELECT count(*) FROM evals) + (SELECT count(*) FROM merges)",
            )
            == len(published) + 4
        ),
        what="every message in Parquet",
    )
    con = connect(run_dir)
    assert con.execute(
        "SELECT episode_id, status, reward, n_llm_calls FROM episodes ORDER BY 1"
    ).fetchall() == [("ok1", "ok", 0.75, 2), ("open1", "open", 1.0, 1)]
    calls = con.execute(
        "SELECT prompt_ids, output_ids, output_logprobs, policy_version, agent, model, stream"
        " FROM llm_calls WHERE episode_id = 'ok1' ORDER BY seq"
    ).fetchall()
    assert calls == [
        ([1, 2, 3], [7, 8, 2**40], [-0.5, -0.25, -0.125], 3, "solver", "policy", "EPISODES"),
        ([1, 2, 4], [7, 8, 2**40], [-0.5, -0.25, -0.125], 3, "solver", "policy", "EPISODES"),
    ]
    assert con.execute("SELECT token_ids, loss_mask, n_trained FROM samples").fetchall() == [
        ([1, 2, 7], [0, 0, 1], 1)
    ]
    assert con.execute("SELECT step, policy_version FROM train_steps").fetchall() == [(1, 4)]
    assert con.execute("SELECT success_rate FROM evals").fetchall() == [(0.5,)]
    assert con.execute("SELECT status, calls FROM merges").fetchall() == [("merged", 2)]
    assert con.execute("SELECT count(DISTINCT stream_seq) = count(*) FROM events").fetchone() == (True,)
    assert sum(ledger.dlq.counts.values()) == 0


async def test_bad_input_is_dead_lettered_and_the_ledger_keeps_going(
    js: JetStreamContext, ledger: Ledger
) -> None:
    begin, llm, env, reward, end = episode("e1")
    await publish(js, begin)
    await publish(js, reward)
    raw = lambda ev, **kw: msgpack.packb({**ev.model_dump(), **kw})  # noqa: E731
    bad: list[tuple[str, bytes, str]] = [
        (S.episode_subject("e1", "env"), b"\xc1\x00garbage", "malformed"),
        (S.episode_subject("e1", "env"), raw(env, v=99), "version"),
        (S.episode_subject("e1", "env"), raw(env, unknown_field=1), "schema"),
        (S.episode_subject("e1", "env"), b"\x80" + b"\x00" * MAX_EVENT_BYTES, "oversized"),
        (S.episode_subject("e2", "env"), encode(env), "subject"),  # episode id differs from the payload's
        ("swarm.ep.e2.e1.env", encode(env), "not_owner"),  # client e2 writing into e1's episode
        (S.episode_subject("e1", "reward"), encode(env), "subject"),  # kind differs
        (
            S.episode_subject("nobody", "env"),
            encode(env.model_copy(update={"episode_id": "nobody"})),
            "unknown_episode",
        ),
        (S.episode_subject("e1", "env"), encode(env), "out_of_order"),  # seq 1 after seq 2
        (S.episode_subject("e1", "reward"), encode(reward), "duplicate"),  # same seq again
        (
            S.train_metrics_subject("other"),
            encode(train_step()),
            "subject",
        ),
        (S.samples_subject("policy"), msgpack.packb({"v": 1, "sample_id": "x"}), "schema"),
    ]
    for i, (subject, data, _) in enumerate(bad):
        await js.publish(subject, data, headers={"Nats-Msg-Id": f"bad-{i}"})

    dlq = await js.pull_subscribe(S.dlq_subject("ledger"), stream=S.DLQ_STREAM)
    got: list = []

    async def fetched() -> bool:
        try:
            got.extend(await dlq.fetch(len(bad) - len(got), timeout=0.2))
        except nats.errors.TimeoutError:
            pass
        return len(got) >= len(bad)

    await wait_for(fetched, what="every bad message in the DLQ")
    # Original subject and bytes intact, reason code right.
    assert sorted(
        (m.headers[bus.SUBJECT_HEADER], m.data, m.headers[bus.REASON_HEADER].split(":")[0]) for m in got
    ) == sorted(bad)
    expected = {}
    for _, _, code in bad:
        expected[code] = expected.get(code, 0) + 1
    assert dict(ledger.dlq.counts) == expected

    await publish(js, end)  # a valid event after all that is still recorded
    run_dir = ledger.cfg.run_dir
    await wait_for(
        lambda: count(run_dir, "SELECT count(*) FROM episodes WHERE status = 'ok'") == 1,
        what="episode e1 ended",
    )
    await wait_for(
        lambda: count(run_dir, "SELECT count(*) FROM dead_letters") == len(bad),
        what="dead letters recorded by the ledger",
    )
    con = connect(run_dir)
    rows = con.execute("SELECT code, subject, data FROM dead_letters WHERE service = 'ledger'").fetchall()
    assert sorted(rows) == sorted((code, subject, data) for subject, data, code in bad)

    async def all_acked() -> bool:  # dead-lettered ones included: nothing is left to be redelivered
        infos = [
            await js.consumer_info(stream, S.durable_name("ledger", stream)) for stream in S.STREAM_SUBJECTS
        ]
        return all(i.num_pending == 0 and i.num_ack_pending == 0 for i in infos)

    await wait_for(all_acked, what="every message acked")


def interleaved(n_episodes: int, prefix: str, window: int = 8) -> list[Event]:
    """Events of `n_episodes` episodes, `window` of them in flight at a time (as concurrent agents do)."""
    out: list[Event] = []
    for start in range(0, n_episodes, window):
        episodes = [
            episode(f"{prefix}{i}", reward=float(i)) for i in range(start, min(start + window, n_episodes))
        ]
        for step in range(5):
            out.extend(evs[step] for evs in episodes)
    return out


def start_ledger(server: NatsServer, run_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "swarmrl.cli",
        "serve",
        "ledger",
        "--run-dir",
        str(run_dir),
        "--flush-rows",
        "40",
        "--flush-interval-s",
        "0.05",
        "--fetch-batch",
        "20",
        "--poll-interval-s",
        "0.05",
    ]
    env = os.environ | {"SWARMRL_NATS": server.service_url}  # credentials never on the command line
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log.open("ab"), env=env)


def recorded(run_dir: Path) -> int:
    """Rows in events and llm_calls; -1 when a file went away while being read: a restarting ledger
    deletes the files of a flush group the kill cut in half (`PartWriter.prepare`)."""
    try:
        return count(run_dir, "SELECT (SELECT count(*) FROM events) + (SELECT count(*) FROM llm_calls)")
    except duckdb.IOException:
        return -1


async def test_sigkill_and_restart_neither_loses_nor_duplicates(
    swarm_nats: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "ledger.log"
    run_dir.mkdir()
    durable = S.durable_name("ledger", S.EPISODES_STREAM)
    events = interleaved(300, "k", window=7)  # 1500 events; episodes straddle every cut below
    a, b, c = 900, 1150, 1320

    async def replayed() -> bool:
        try:
            info = await js.consumer_info(S.EPISODES_STREAM, durable)
        except nats.js.errors.NotFoundError:
            return False
        return info.num_pending == 0 and info.num_ack_pending == 0 and info.delivered.stream_seq >= c

    proc = start_ledger(swarm_nats, run_dir, log)
    try:
        # 1. SIGKILL while events stream in, after some rows are written.
        publisher = asyncio.create_task(publish_all(js, events[:a]))
        await wait_for(lambda: recorded(run_dir) >= 100, what="first rows written")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        at_kill = recorded(run_dir)
        await publisher
        await publish_all(js, events[a:b])  # while no ledger runs
        proc = start_ledger(swarm_nats, run_dir, log)
        await publish_all(js, events[b:c])
        await wait_for(lambda: recorded(run_dir) >= c, timeout=30, what="events up to the third cut")
        # 2. Deterministic worst case: every ack lost (durable consumer dropped), episodes left open.
        # Everything is redelivered and at or below what is on disk, so all of it must be skipped, and
        # the open episodes must be known again from the Parquet files to accept their later events.
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        await js.delete_consumer(S.EPISODES_STREAM, durable)
        proc = start_ledger(swarm_nats, run_dir, log)
        await wait_for(replayed, what="the replay acked")
        await publish_all(js, events[c:])
        await wait_for(lambda: recorded(run_dir) >= len(events), timeout=30, what="every event recorded")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    assert 0 < at_kill < len(events)
    con = connect(run_dir)
    keys = "SELECT episode_id, client_id, seq FROM events UNION ALL SELECT episode_id, client_id, seq FROM llm_calls"
    total, distinct = con.execute(
        f"SELECT count(*), count(DISTINCT (episode_id, client_id, seq)) FROM ({keys})"
    ).fetchone()
    assert total == distinct == len(events), log.read_text()[-3000:]
    assert con.execute("SELECT count(*) FROM dead_letters").fetchone() == (0,), log.read_text()[-3000:]
    assert con.execute("SELECT status, count(*), sum(reward) FROM episodes GROUP BY ALL").fetchall() == [
        ("ok", 300, float(sum(range(300))))
    ]
