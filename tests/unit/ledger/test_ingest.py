import msgpack
import pytest

from swarmrl.schemas import LostEpisode, MergeStats, WireError, encode
from swarmrl.schemas import subjects as S
from swarmrl.services.ledger.ingest import Ingest, Rejected
from tests.unit.ledger.factories import episode, train_step


def _code(fn, *args) -> str:
    with pytest.raises((WireError, Rejected)) as err:
        fn(*args)
    return str(err.value).split(":", 1)[0]


def test_bad_episode_input_is_rejected_with_its_code() -> None:
    ingest = Ingest(max_event_bytes=10_000)
    begin, llm, env, reward, end = episode("e1")
    ep = ingest.episode
    assert _code(ep, S.episode_subject("e1", "begin"), b"\xc1", "EPISODES", 1, 0.0) == "malformed"
    assert (
        _code(
            ep,
            S.episode_subject("e1", "begin"),
            msgpack.packb({**begin.model_dump(), "v": 99}),
            "EPISODES",
            1,
            0.0,
        )
        == "version"
    )
    assert (
        _code(
            ep, S.episode_subject("e1", "begin"), msgpack.packb({"v": 1, "kind": "begin"}), "EPISODES", 1, 0.0
        )
        == "schema"
    )
    assert _code(ep, S.episode_subject("e1", "begin"), b"\x00" * 10_001, "EPISODES", 1, 0.0) == "oversized"
    assert _code(ep, S.episode_subject("other", "begin"), encode(begin), "EPISODES", 1, 0.0) == "subject"
    assert _code(ep, S.episode_subject("e1", "end"), encode(begin), "EPISODES", 1, 0.0) == "subject"
    assert _code(ep, "swarm.ep.e1.begin", encode(begin), "EPISODES", 1, 0.0) == "subject"  # no owner token
    # a client writing into an episode it does not own (the server let it: the subject is its own)
    assert _code(ep, "swarm.ep.mallory.e1.begin", encode(begin), "EPISODES", 1, 0.0) == "not_owner"
    assert _code(ep, S.episode_subject("e1", "env"), encode(env), "EPISODES", 1, 0.0) == "unknown_episode"
    ep(S.episode_subject("e1", "begin"), encode(begin), "EPISODES", 2, 0.0)
    ep(S.episode_subject("e1", "reward"), encode(reward), "EPISODES", 3, 0.0)
    assert _code(ep, S.episode_subject("e1", "reward"), encode(reward), "EPISODES", 4, 0.0) == "duplicate"
    assert _code(ep, S.episode_subject("e1", "env"), encode(env), "EPISODES", 5, 0.0) == "out_of_order"


def test_rejected_event_leaves_the_ordering_state_alone() -> None:
    ingest = Ingest()
    begin, llm, *_ = episode("e1")
    bad = msgpack.packb({**llm.model_dump(), "output_ids": [1, 2**64 - 1, 3]})
    assert _code(ingest.episode, S.episode_subject("e1", "begin"), bad, "EPISODES", 1, 0.0) == "subject"
    ingest.episode(S.episode_subject("e1", "begin"), encode(begin), "EPISODES", 1, 0.0)
    assert _code(ingest.episode, S.episode_subject("e1", "llm"), bad, "EPISODES", 2, 0.0) == "schema"
    table, _ = ingest.episode(S.episode_subject("e1", "llm"), encode(llm), "EPISODES", 3, 0.0)
    assert table == "llm_calls"


def test_metrics_are_routed_by_subject() -> None:
    ingest = Ingest()
    step = train_step()
    assert ingest.metric(S.train_metrics_subject("policy"), encode(step), "METRICS", 1)[0] == "train_steps"
    assert (
        ingest.metric(
            S.MERGE_METRICS_SUBJECT, encode(MergeStats(episode_id="e", status="empty")), "METRICS", 2
        )[0]
        == "merges"
    )
    assert _code(ingest.metric, S.train_metrics_subject("other"), encode(step), "METRICS", 3) == "subject"
    assert _code(ingest.metric, S.eval_metrics_subject("policy"), encode(step), "METRICS", 4) == "schema"


def test_lost_episode_records_have_their_own_table_and_their_model_subject() -> None:
    ingest = Ingest()
    lost = LostEpisode(episode_id="e", model="policy", group_key="g", status="timeout", reason="silent")
    table, row = ingest.sample(S.lost_subject("policy"), encode(lost), "SAMPLES", 7)
    assert table == "lost_episodes" and (row["episode_id"], row["model"], row["stream_seq"]) == (
        "e",
        "policy",
        7,
    )
    assert _code(ingest.sample, S.lost_subject("other"), encode(lost), "SAMPLES", 8) == "subject"
    assert _code(ingest.sample, S.samples_subject("policy"), encode(lost), "SAMPLES", 9) == "schema"


def test_a_call_finishing_after_the_abort_is_recorded_but_not_after_the_end() -> None:
    from swarmrl.schemas import AbortEvent

    ingest = Ingest()
    for eid, closer in (("quit", "abort"), ("done", "end")):
        begin, llm, env, reward, end = episode(eid)
        last = end if closer == "end" else AbortEvent(episode_id=eid, seq=end.seq, client_id=end.client_id)
        ingest.episode(S.episode_subject(eid, "begin"), encode(begin), "EPISODES", 1, 0.0)
        ingest.episode(S.episode_subject(eid, closer), encode(last), "EPISODES", 2, 0.0)
        if closer == "abort":  # the gateway finished the call the client had given up on: a real call
            table, row = ingest.episode(S.episode_subject(eid, "llm"), encode(llm), "EPISODES", 3, 0.0)
            assert table == "llm_calls" and row["episode_id"] == eid
        else:
            assert _code(ingest.episode, S.episode_subject(eid, "llm"), encode(llm), "EPISODES", 3, 0.0) == (
                "after_end"
            )


def test_open_episodes_of_vanished_clients_are_forgotten_after_the_ttl() -> None:
    ingest = Ingest()
    for eid, at in (("vanished", 0.0), ("alive", 90.0)):
        begin, *_ = episode(eid)
        ingest.episode(S.episode_subject(eid, "begin"), encode(begin), "EPISODES", 1, at)
    assert ingest.tracker.expire(now=100.0, timeout_s=50.0) == ["vanished"]
    assert set(ingest.tracker.open) == {"alive"}
    _, _, env, _, _ = episode("vanished")
    assert _code(ingest.episode, S.episode_subject("vanished", "env"), encode(env), "EPISODES", 2, 101.0) == (
        "after_end"
    )
