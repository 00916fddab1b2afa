"""The byte-level BPE tokenizer: round-trips, special tokens, digits."""

from __future__ import annotations

import random
import string

from swarmrl.bootstrap import build_tokenizer


def test_round_trips_arbitrary_text():
    tokenizer = build_tokenizer()
    rng = random.Random(0)
    samples = ["", " ", "\n\n", "  leading and trailing  ", "tabs\tand\r\nCRLF", "émoji 🚀 and 中文"]
    samples.append("".join(chr(c) for c in range(1, 128)))  # every ASCII byte, control chars too
    samples += ["".join(rng.choice(string.printable) for _ in range(rng.randint(1, 200))) for _ in range(200)]
    for text in samples:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text


def test_special_and_added_tokens_are_single_ids():
    tokenizer = build_tokenizer()
    assert 500 <= len(tokenizer) <= 2100
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    for token in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"):
        assert len(tokenizer.encode(f"a{token}b", add_special_tokens=False)) == 3, token
    # Tool-call tags survive skip_special_tokens (the gateway parses them from decoded text).
    ids = tokenizer.encode('<tool_call>\n{"a": 1}\n</tool_call><|im_end|>', add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == '<tool_call>\n{"a": 1}\n</tool_call>'
    assert tokenizer.encode("x", add_special_tokens=True) == tokenizer.encode("x", add_special_tokens=False)


def test_digits_are_split_and_vocab_is_deterministic():
    tokenizer = build_tokenizer()
    assert tokenizer.tokenize("12345") == list("12345")
    assert build_tokenizer().get_vocab() == tokenizer.get_vocab()
