"""Where a sourced message came from: its origin stream and sequence, read off `Nats-Stream-Source`
(the header nats-server puts on every message a stream sources), else its own position."""

from nats.aio.msg import Msg

from swarmrl.schemas import subjects as S
from swarmrl.services.common.bus import source_position


def test_a_sourced_message_is_placed_in_its_origin_stream() -> None:
    src, dest = S.LEDGER_PARTITION_TRANSFORM
    header = (
        f"EPISODES 4711 {src} {dest} swarm.ep.alice.alice-ep1.begin CRfU5WkL"  # as nats-server 2.15 writes it
    )
    msg = Msg(
        None,
        "swarm.lep.3.alice.alice-ep1.begin",
        "$JS.ACK.LEDGER_PARTS.c.1.9.9.0.0",
        b"",
        {"Nats-Stream-Source": header},
    )  # type: ignore[arg-type]
    assert source_position(msg) == ("EPISODES", 4711)
    assert S.unpartitioned(msg.subject) == "swarm.ep.alice.alice-ep1.begin"


def test_a_message_of_its_own_stream_keeps_its_position() -> None:
    reply = "$JS.ACK.EPISODES.ledger-EPISODES.1.42.42.1700000000000000000.0"  # v1 ack subject
    msg = Msg(None, "swarm.ep.alice.alice-ep1.begin", reply, b"", None)  # type: ignore[arg-type]
    assert source_position(msg) == ("EPISODES", 42)
