import msgpack
import pytest

from swarmrl.schemas import (
    MAX_EVENT_BYTES,
    ActionResult,
    BeginEvent,
    EvalResult,
    LlmEvent,
    MergeStats,
    RewardEvent,
    Sample,
    SampleDrops,
    WireError,
    decode_event,
    decode_metric,
    decode_sample,
    encode,
)
from swarmrl.schemas import subjects as S


def test_every_event_kind_round_trips() -> None:
    events = [
        BeginEvent(episode_id="ep-1", seq=0, client_id="c", task_id="t", models=["policy"]),
        RewardEvent(episode_id="ep-1", seq=1, client_id="c", value=0.5, agent="a"),
        LlmEvent(
            episode_id="ep-1",
            seq=0,
            client_id="gateway-x",
            call_id="x",
            agent="a",
            model="policy",
            prompt_ids=[1, 2],
            output_ids=[3],
            output_logprobs=[-0.1],
            policy_version=2,
        ),
    ]
    for ev in events:
        assert decode_event(encode(ev)) == ev


def test_plain_msgpack_map_from_another_language_is_accepted() -> None:
    # What a Go or JS agent would send: a plain map, no SDK involved.
    raw = {
        "v": 1,
        "kind": "reward",
        "episode_id": "e1",
        "seq": 3,
        "ts": 1.0,
        "client_id": "go-agent",
        "client_version": "v1",
        "value": 1.0,
        "agent": "",
        "name": "reward",
    }
    ev = decode_event(msgpack.packb(raw))
    assert isinstance(ev, RewardEvent) and ev.value == 1.0


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"\xc1\xc1", "malformed"),
        (msgpack.packb([1, 2]), "malformed"),
        (msgpack.packb({"v": 99, "kind": "end"}), "version"),
        (msgpack.packb({"v": 1, "kind": "end", "episode_id": "e", "client_id": "c"}), "schema"),
        (msgpack.packb({"v": 1, "kind": "nope", "episode_id": "e", "seq": 0, "client_id": "c"}), "schema"),
        (
            msgpack.packb({"v": 1, "kind": "end", "episode_id": "bad.id", "seq": 0, "client_id": "c"}),
            "schema",
        ),
        (
            msgpack.packb({"v": 1, "kind": "end", "episode_id": "e", "seq": 0, "client_id": "c", "x": 1}),
            "schema",
        ),
        (b"\x00" * (MAX_EVENT_BYTES + 1), "oversized"),
    ],
)
def test_bad_input_names_its_reason(data: bytes, code: str) -> None:
    with pytest.raises(WireError) as err:
        decode_event(data)
    assert err.value.code == code


def test_sample_lengths_must_agree() -> None:
    good = Sample(
        sample_id="e.a.m.0",
        model="m",
        episode_id="e",
        agent="a",
        task_id="t",
        group_key="t",
        token_ids=[1, 2],
        loss_mask=[0, 1],
        logprobs=[0.0, -1.0],
        policy_versions=[-1, 0],
        reward=1.0,
    )
    assert decode_sample(encode(good)) == good
    bad = good.model_dump() | {"loss_mask": [1]}
    with pytest.raises(WireError, match="loss_mask"):
        decode_sample(msgpack.packb(bad))
    # `task` is optional on the wire: a publisher that predates it still decodes, as task "".
    old = {k: v for k, v in good.model_dump().items() if k != "task"}
    assert decode_sample(msgpack.packb(old)).task == ""
    named = good.model_copy(update={"task": "countdown"})
    assert decode_sample(encode(named)).task == "countdown"


def test_subject_names_reject_unsafe_tokens() -> None:
    assert S.episode_subject("abc", "end") == "swarm.ep.abc.abc.end"
    assert S.parse_episode_subject("swarm.ep.abc.abc.end") == ("abc", "end")
    with pytest.raises(ValueError, match="not a valid subject token"):
        S.samples_subject("Qwen2.5")
    with pytest.raises(ValueError):
        S.parse_episode_subject("swarm.ep.abc.abc.nope")
    with pytest.raises(ValueError):
        S.parse_episode_subject("swarm.ep.abc.end")  # no owner token


def test_an_episode_belongs_to_the_client_named_before_its_first_underscore() -> None:
    assert S.episode_owner("calc-0_9f3a") == "calc-0" and S.episode_owner("calc-0") == "calc-0"
    assert S.episode_subject("calc-0_9f3a", "reward") == "swarm.ep.calc-0.calc-0_9f3a.reward"
    # `calc` may not write into `calc-0`'s episodes, nor `calc-0` into `calc`'s: names end at `_`
    for subject in ("swarm.ep.calc.calc-0_9f3a.reward", "swarm.ep.calc-0.calc_9f3a.reward"):
        with pytest.raises(S.NotOwnerError):
            S.parse_episode_subject(subject)
    with pytest.raises(ValueError, match="client name"):
        S.new_episode_id("team_calc", "x")  # `_` would make the owner ambiguous
    assert S.owner_name("client-team_calculator-0") == "client-team-calculator-0"
    perms = S.agent_permissions("calc-0")
    assert "swarm.ep.calc-0.*.reward" in perms["publish"]["allow"]
    assert not any(".llm" in p and p.startswith("swarm.ep") for p in perms["publish"]["allow"])
    # its own inbox, and the outcomes of its own groups (GroupOutcome), nothing else
    assert perms["subscribe"]["allow"] == ["_INBOX.calc-0.>", "swarm.metrics.outcome.calc-0.*"]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_nonfinite_reward_is_a_schema_error(value: float) -> None:
    raw = {"v": 1, "kind": "reward", "episode_id": "e1", "seq": 1, "ts": 1.0, "client_id": "c",
           "client_version": "v", "value": value, "agent": "", "name": "reward"}  # fmt: skip
    with pytest.raises(WireError) as err:
        decode_event(msgpack.packb(raw))
    assert err.value.code == "schema"


def test_a_metric_is_decoded_as_the_record_its_subject_names() -> None:
    records = {
        S.eval_metrics_subject("m1"): EvalResult(model="m1", step=3, task="t", success_rate=0.5, n=2),
        S.drops_metrics_subject("m1"): SampleDrops(model="m1", step=3),
        S.MERGE_METRICS_SUBJECT: MergeStats(episode_id="e", status="empty"),
        S.ACTION_METRICS_SUBJECT: ActionResult(action_id="a", episode_id="e", kind="python", status="ok"),
    }
    for subject, record in records.items():
        assert decode_metric(subject, encode(record)) == record
    drops = encode(SampleDrops(model="m1", step=3))
    for subject in (S.drops_metrics_subject("m2"), "swarm.metrics.other", "swarm.metrics.train.a.b"):
        with pytest.raises(WireError) as err:
            decode_metric(subject, drops)
        assert err.value.code == "subject", subject
