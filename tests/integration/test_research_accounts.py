"""Two runs side by side on one nats-server, each in NATS accounts of its own (research/accounts.py).

Both use the same subjects, stream names, KV bucket and client names, as two runs of one study do;
neither sees anything of the other, and removing one run's accounts leaves the other untouched.
"""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.aio.msg import Msg

from swarmrl.core.config import plain_servers
from swarmrl.infra.credentials import AgentRegistry
from swarmrl.infra.nats_server import NatsServer
from swarmrl.research.accounts import RunAccounts, wait_usable
from swarmrl.schemas import BeginEvent, encode
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from tests.conftest import wait_for


async def test_two_runs_share_a_server_without_meeting(nats_server: NatsServer) -> None:
    accounts = RunAccounts(nats_server.conf_dir)
    servers = plain_servers(nats_server.plain_url)
    runs = {key: accounts.create(key) for key in ("study-base-s1-a1", "study-fast-s1-a1")}
    assert accounts.keys() == sorted(runs)
    services = {}
    for key, acct in runs.items():
        await wait_usable(acct.url(servers))
        services[key] = await bus.connect(acct.url(servers), f"test-{key}")
        await bus.ensure_streams(services[key].jetstream())  # same stream names in both: no clash

    # The same client name in both runs, minted as `up --nats-conf <run conf dir>` does (its reload
    # reaches the server through the run folder's link to the server's pid file).
    agents = {}
    for key, acct in runs.items():
        cred = AgentRegistry(acct.conf_dir).mint("calculator-0", servers)
        agents[key] = await nats.connect(**cred.nats_options(), max_reconnect_attempts=0)
    base, fast = runs
    ev = BeginEvent(episode_id="calculator-0_1", seq=0, client_id="c", task_id="t")
    ack = (
        await agents[base]
        .jetstream()
        .publish(S.episode_subject(ev.episode_id, "begin"), encode(ev), headers={"Nats-Msg-Id": ev.msg_id})
    )
    assert ack.stream == S.EPISODES_STREAM
    counts = {
        k: (await nc.jetstream().stream_info(S.EPISODES_STREAM)).state.messages for k, nc in services.items()
    }
    assert counts == {base: 1, fast: 0}

    # Core traffic: a sample published in one run never reaches the other's subscribers.
    seen: dict[str, list[str]] = {base: [], fast: []}
    for key, nc in services.items():

        async def record(msg: Msg, key: str = key) -> None:
            seen[key].append(msg.subject)

        await nc.subscribe(f"{S.SAMPLES_PREFIX}.>", cb=record)
        await nc.flush()
    await services[fast].publish(f"{S.SAMPLES_PREFIX}.policy", b"x")
    await services[fast].flush()  # processed by the server before the flushes below return
    for nc in services.values():
        await nc.flush()
    assert seen == {base: [], fast: [f"{S.SAMPLES_PREFIX}.policy"]}

    # A run's credentials open only its own accounts.
    with pytest.raises(Exception):  # noqa: B017 - nats-py raises auth errors of several types
        await nats.connect(f"nats://{runs[base].user}:{runs[fast].password}@127.0.0.1:{nats_server.port}",
                           allow_reconnect=False, max_reconnect_attempts=0)  # fmt: skip

    for nc in [*agents.values(), *services.values()]:
        await nc.close()
    store = nats_server.store_dir / "jetstream"
    assert (store / runs[base].account / "streams" / S.EPISODES_STREAM).is_dir()
    await asyncio.to_thread(accounts.remove, base, servers)  # after the run: streams deleted, accounts gone
    assert accounts.keys() == [fast] and not runs[base].conf_dir.exists()
    gone = store / runs[base].account / "streams"
    try:  # the server may still be removing the account's store: gone or empty, either is right
        leftover = list(gone.iterdir())
    except FileNotFoundError:
        leftover = []
    assert leftover == []
    assert (store / runs[fast].account / "streams" / S.EPISODES_STREAM).is_dir()

    async def refused() -> bool:  # the reload `remove` signals applies in milliseconds, later under load
        try:
            nc = await nats.connect(runs[base].url(servers), allow_reconnect=False, max_reconnect_attempts=0)
        except Exception:
            return True
        await nc.close()
        return False

    await wait_for(refused, timeout=10, what="the removed run's credentials to be refused")
    nc = await nats.connect(runs[fast].url(servers))
    assert (await nc.jetstream().stream_info(S.EPISODES_STREAM)).state.messages == 0
    await nc.close()
    # The swarm's own accounts (what `swarmrl up` without research uses) are untouched by all this.
    nc = await bus.connect(nats_server.service_url, "test-service")
    await bus.ensure_streams(nc.jetstream())
    await nc.close()


def test_a_restarted_server_keeps_the_runs_accounts(nats_server: NatsServer) -> None:
    accounts = RunAccounts(nats_server.conf_dir)
    acct = accounts.create("study-x-s1-a1")
    nats_server.restart()
    asyncio.run(wait_usable(acct.url(plain_servers(nats_server.plain_url))))


async def test_a_run_sets_up_its_streams_while_the_next_runs_account_is_added(
    nats_server: NatsServer,
) -> None:
    """`research --parallel`: run 1's `up` creates its streams while run 2's account is added. The
    reload that applies it answers JetStream calls of run 1's account with 503 for a moment (CI saw a
    run's `up` fail so); `bus.ensure_streams` waits that out."""
    accounts = RunAccounts(nats_server.conf_dir)
    servers = plain_servers(nats_server.plain_url)
    for i in range(5):
        acct = accounts.create(f"study-base-s{i}-a1")
        await wait_usable(acct.url(servers))
        nc = await nats.connect(acct.url(servers))
        try:
            adding = asyncio.create_task(asyncio.to_thread(accounts.create, f"study-fast-s{i}-a1"))
            await bus.ensure_streams(nc.jetstream())
            await adding
            assert (await nc.jetstream().stream_info(S.EPISODES_STREAM)).config.name == S.EPISODES_STREAM
        finally:
            await nc.close()


async def test_streams_setup_gives_up_on_a_lasting_outage(nats_server: NatsServer, monkeypatch) -> None:
    """The wait is bounded: JetStream that never answers (a domain no server serves) fails after it."""
    monkeypatch.setattr(bus, "ENSURE_STREAMS_S", 1.0)
    nc = await nats.connect(nats_server.service_url)
    try:
        js = nc.jetstream()
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(nats.js.errors.ServiceUnavailableError):
            await bus.ensure_streams(nc.jetstream(domain="nowhere"))  # no server answers there
        assert loop.time() - started >= 1.0
        await bus.ensure_streams(js)  # the real domain: set up at once
    finally:
        await nc.close()
