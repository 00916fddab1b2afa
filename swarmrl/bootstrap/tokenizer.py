"""Builds the tiny model's tokenizer offline: byte-level BPE (every byte is in the alphabet, so any
text round-trips), digits split one by one (Qwen2's pre-tokenizer regex, kind to arithmetic),
trained on text from the `calculator` and `guess_number` tasks so their prompts take few tokens.
Every preset shares this one tokenizer, and it must not change when tasks are added (the default
model's weights would): its corpus tasks are pinned (`CORPUS_TASKS`), not "every task".

Special tokens follow Qwen2.5: `<|endoftext|>` (pad), `<|im_start|>`, `<|im_end|>` (eos), plus the
non-special added tokens `<tool_call>`, `</tool_call>`, `<tool_response>`, `</tool_response>`
(kept by `decode(skip_special_tokens=True)`, as the gateway's tool-call parser needs).
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Iterator
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from swarmrl.agents.tasks import TASKS
from swarmrl.agents.tasks.base import message_text
from swarmrl.bootstrap.chat_template import CHAT_TEMPLATE, TOOLS_POSTAMBLE, TOOLS_PREAMBLE

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
ADDED_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
VOCAB_SIZE = 1024
# In the order the corpus used when these were all of TASKS: the shared rng makes the order matter.
CORPUS_TASKS = ("guess_number", "calculator")
# Qwen2's split: one digit per pre-token, letters with an optional leading space, punctuation runs.
SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GENERAL_TEXT = """The quick brown fox jumps over the lazy dog. You are a helpful assistant.
Please answer the question. I think the answer is correct, but let me check it again.
What is the result? Here is my reasoning: first add the numbers, then multiply them.
Sorry, I cannot help with that. Thank you! Hello, how are you today? Let's try another one.
"""


def _corpus(seed: int = 0, episodes_per_task: int = 400) -> Iterator[str]:
    """Task demonstrations (contents and tool-call JSON), tool specs, and some general text."""
    rng = random.Random(seed)
    for spec in (TASKS[name] for name in CORPUS_TASKS):
        assert spec.demonstration is not None  # single-agent tasks
        for tool in (spec.tools or []) * 50:  # repeated: min_frequency=2 must see its pairs
            yield json.dumps(tool)
        tasks = spec.train_tasks(seed)
        for _ in range(episodes_per_task):
            for message in spec.demonstration(next(tasks), rng):
                yield message["role"] + "\n" + message_text(message)
                for call in message.get("tool_calls") or []:
                    function = call["function"]
                    yield '{"name": "' + function["name"] + '", "arguments": ' + function["arguments"]
    tools_text = TOOLS_PREAMBLE + TOOLS_POSTAMBLE
    for tag in ADDED_TOKENS:  # trained around the tags, never into them: they are added tokens
        tools_text = tools_text.replace(tag, " ")
    yield from [tools_text] * 50
    yield from [GENERAL_TEXT] * 20
    # Every printable character next to letters and digits, so common pairs exist for any ASCII.
    for _ in range(50):
        yield "".join(rng.choice(string.printable) for _ in range(64))


def build_tokenizer(
    out_dir: str | Path | None = None, seed: int = 0, vocab_size: int = VOCAB_SIZE
) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE tokenizer (the same seed, the same vocabulary; `vocab_size` is a
    target the corpus may not reach), wrap it with the chat template, and save it into `out_dir`."""
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[PAD, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
        padding_side="left",  # batched generation pads on the left
        clean_up_tokenization_spaces=False,
    )
    if out_dir is not None:
        tokenizer.save_pretrained(str(out_dir))
    return tokenizer
