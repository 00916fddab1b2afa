"""Incremental detokenizing and tool-call hold-back of the gateway's streaming, on the tiny model's
real byte-level tokenizer (multi-byte characters span several tokens there)."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from swarmrl.services.gateway.streaming import TextDeltas

TEXTS = ["héllo wörld", "🎉 ok", "日本語 and 🎉🎉", "a  b\n\nc", "plain ascii text, with spaces"]


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.mark.parametrize("text", TEXTS)
def test_token_by_token_text_grows_by_whole_characters_to_the_full_decode(tok, text: str) -> None:
    ids = tok.encode(text)
    assert len(ids) > len(text.split()), "the case should split characters over tokens"
    deltas = TextDeltas(lambda xs: tok.decode(xs, skip_special_tokens=False))
    seen = [deltas.push(ids[: i + 1]) for i in range(len(ids))]
    assert seen[-1] == tok.decode(ids) == text
    for before, after in zip(seen, seen[1:], strict=False):
        assert after.startswith(before)  # only ever extended: a delta never has to be taken back
    assert not any(s.endswith("\ufffd") for s in seen)  # incomplete characters were held back
    if any(ord(c) > 127 for c in text):
        assert any(a == b for a, b in zip(seen, seen[1:], strict=False)), "some token completed no character"


def test_pushing_several_tokens_at_once_gives_the_same_text(tok) -> None:
    ids = tok.encode(TEXTS[2])
    deltas = TextDeltas(lambda xs: tok.decode(xs, skip_special_tokens=False))
    seen = [deltas.push(ids[:i]) for i in (2, 3, 7, len(ids))]  # a slow reader skips events
    assert seen[-1] == TEXTS[2] and all(b.startswith(a) for a, b in zip(seen, seen[1:], strict=False))


def test_a_character_that_never_completes_stays_held_back(tok) -> None:
    ids = tok.encode("ok 🎉")[:-1]  # the emoji's last byte never comes
    text = TextDeltas(lambda xs: tok.decode(xs, skip_special_tokens=False)).push(ids)
    assert text == "ok " and tok.decode(ids).endswith("\ufffd")
