"""Each service role's NATS user may do its own job and nothing else (least privilege), against the
real nats-server with the config swarmrl renders (`infra/credentials.py`, `schemas/subjects.py`).

A publish the server refuses comes back as a `Permissions Violation` error on the connection (the
message goes nowhere); one it allows raises none. Every service test that connects as its role
(`start_merger`, `generation_stack`, `swarmrl up`) shows the allowed side does the whole job.
"""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.aio.client import Client

from swarmrl.infra.nats_server import NatsServer, role_urls
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus

SAMPLE = S.samples_subject("policy")
LLM = S.episode_subject("a_1", "llm")
MODEL_KEY = f"$KV.{S.MODELS_BUCKET}.policy"

PUBLISH = [
    # Only the merger writes samples; only the gateway writes `llm` events (agents the other kinds).
    ("merger", SAMPLE, True),
    ("gateway", SAMPLE, False),
    ("trainer", SAMPLE, False),
    ("ledger", SAMPLE, False),
    ("gateway", LLM, True),
    ("merger", LLM, False),
    ("gateway", S.episode_subject("a_1", "end"), False),
    ("actions", LLM, False),
    # Only gateways tell each other the calls they served (each agent's rate across gateways).
    ("gateway", S.GATEWAY_CALLS, True),
    ("merger", S.GATEWAY_CALLS, False),
    # Only trainers write model versions; the ledger and the tracker publish only their dead letters.
    ("trainer", MODEL_KEY, True),
    ("gateway", MODEL_KEY, False),
    ("engine", MODEL_KEY, False),
    ("ledger", S.MERGE_METRICS_SUBJECT, False),
    ("ledger", S.dlq_subject("ledger"), True),
    ("ledger", S.dlq_subject("merger"), False),
    ("tracker", S.train_metrics_subject("policy"), False),
    ("trainer", S.train_metrics_subject("policy"), True),
    # Only trainers put weights into the object store; engines read them.
    ("trainer", f"$O.{S.WEIGHTS_BUCKET}.C.x", True),
    ("engine", f"$O.{S.WEIGHTS_BUCKET}.C.x", False),
    ("gateway", f"$O.{S.WEIGHTS_BUCKET}.M.x", False),
    ("engine", f"$JS.API.STREAM.PURGE.OBJ_{S.WEIGHTS_BUCKET}", False),
    ("merger", S.MERGE_METRICS_SUBJECT, True),
    # Actions: the scheduler releases work, workers only report it done.
    ("actions", S.action_run_subject("python"), True),
    ("action-worker", S.action_run_subject("python"), False),
    ("action-worker", S.action_done_subject("k1"), True),
    # Nobody reads what another role consumes, and nobody manages streams or other roles' consumers.
    ("trainer", f"$JS.API.CONSUMER.CREATE.{S.EPISODES_STREAM}.x", False),
    ("gateway", f"$JS.API.CONSUMER.MSG.NEXT.{S.SAMPLES_STREAM}.trainer-samples-policy", False),
    ("merger", f"$JS.API.CONSUMER.DELETE.{S.EPISODES_STREAM}.ledger-episodes", False),
    ("ledger", f"$JS.API.STREAM.MSG.GET.{S.SAMPLES_STREAM}", False),
    *(
        (role, f"$JS.API.STREAM.{verb}.{S.SAMPLES_STREAM}", False)
        for role in S.SERVICE_ROLES
        for verb in ("CREATE", "UPDATE", "DELETE", "PURGE")
    ),  # fmt: skip
]


async def _connect(url: str) -> tuple[Client, list[str]]:
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(url, error_cb=on_error, max_reconnect_attempts=0)
    return nc, errors


async def _refused(nc: Client, errors: list[str], subject: str) -> bool:
    """Publish to `subject` (an empty message: no stream or API acts on it); whether the server
    refused it for permissions."""
    await nc.publish(subject, b"", reply=nc.new_inbox())
    await nc.flush()
    await asyncio.sleep(0.1)  # the -ERR follows the PONG only if the server was slow to send it
    # nats-py lower-cases the server's error text, subject included
    return any(f'permissions violation for publish to "{subject.lower()}"' in e.lower() for e in errors)


async def test_each_role_publishes_only_where_its_job_is(swarm_nats: NatsServer) -> None:
    conns = {role: await _connect(swarm_nats.url(role)) for role in {r for r, _, _ in PUBLISH}}
    try:
        wrong = []
        for role, subject, allowed in PUBLISH:
            nc, errors = conns[role]
            if await _refused(nc, errors, subject) == allowed:
                wrong.append(f"{role} {'refused' if allowed else 'allowed'} {subject}")
        assert not wrong, wrong
    finally:
        for nc, _ in conns.values():
            await nc.close()


async def test_roles_subscribe_only_to_what_they_serve(swarm_nats: NatsServer) -> None:
    cases = [
        ("gateway", S.llm_subject("policy"), True),
        ("gateway", S.episode_filter("*", "end"), True),
        ("gateway", S.GATEWAY_CALLS, True),
        ("engine", S.GATEWAY_CALLS, False),
        ("ledger", S.llm_subject("policy"), False),
        ("merger", S.TOKEN_REQUESTS, False),
        ("engine", f"{S.SAMPLES_PREFIX}.>", False),
        ("actions", S.ACT_REQUESTS, True),
        ("trainer", S.ACT_REQUESTS, False),
    ]
    wrong = []
    for role, subject, allowed in cases:
        nc, errors = await _connect(swarm_nats.url(role))
        try:
            await nc.subscribe(subject)
            await nc.flush()
            await asyncio.sleep(0.1)
            refused = any("permissions violation for subscription" in e.lower() for e in errors)
            if refused == allowed:
                wrong.append(f"{role} {'refused' if allowed else 'allowed'} subscribing to {subject}")
        finally:
            await nc.close()
    assert not wrong, wrong


async def test_a_role_finds_the_streams_and_cannot_create_them(nats_server: NatsServer) -> None:
    """A role's `ensure_streams` only reads what the operator set up; on a bare server it fails with
    a message that says what to do, instead of the server's refusal as a bare timeout."""
    nc = await bus.connect(nats_server.url("merger"), "test-merger")
    try:
        with pytest.raises(RuntimeError, match="operator user"):
            await bus.ensure_streams(nc.jetstream())
        admin = await bus.connect(nats_server.service_url, "test-operator")
        await bus.ensure_streams(admin.jetstream())
        await admin.close()
        await bus.ensure_streams(nc.jetstream())  # now only stream infos: allowed
    finally:
        await nc.close()


def test_up_on_given_servers_derives_role_urls_from_their_password_variables(nats_server: NatsServer) -> None:
    url = f"{nats_server.service_url},nats://service:x@10.0.0.2:4222"
    urls = role_urls(url, nats_server.password_env)
    assert (
        urls["ledger"]
        == f"{nats_server.url('ledger')},nats://ledger:{nats_server.passwords['ledger']}@10.0.0.2:4222"
    )
    assert set(urls) == set(S.SERVICE_ROLES)
    partial = {k: v for k, v in nats_server.password_env.items() if "LEDGER" not in k}
    assert role_urls(url, partial) == {}  # one missing: every service keeps the given user
