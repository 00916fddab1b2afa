"""Prompt construction with exact token reuse (pure logic, no NATS, no HTTP).

The first call of an episode is rendered with the model's chat template. A later call whose messages
extend an earlier call's messages and reply reuses that call's exact `prompt_ids + output_ids` and
tokenizes only the new tail, so the merger can fold the earlier call into the later one.

`tool_prompt` `hermes` (`auto`: when the template drops `tools`, as SmolLM2's does) writes the tools into
the system message in Hermes' `<tool_call>` convention, with earlier calls as `<tool_call>` blocks and
results as `<tool_response>` user turns, and applies the template to those plain messages.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

PLACEHOLDER = "SWARMRLREUSEDTURN9f2c1"
TURN_ENDS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>")
"""Tokens that end an assistant turn in the common chat formats (ChatML, Llama 3, Phi, Gemma)."""


def text_of(content: Any) -> str:
    """OpenAI content (None, str, or a list of parts) as plain text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(
        p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text"
    )


def _arguments(raw: Any) -> Any:
    try:
        return json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        return raw


def template_message(m: dict[str, Any]) -> dict[str, Any]:
    """A message in the form HF chat templates expect (plain-text content, dict tool arguments)."""
    out: dict[str, Any] = {"role": m["role"], "content": text_of(m.get("content"))}
    if m.get("tool_calls"):
        out["tool_calls"] = [
            {
                "type": "function",
                "id": tc.get("id", ""),
                "function": {
                    "name": tc["function"]["name"],
                    "arguments": _arguments(tc["function"].get("arguments")),
                },
            }
            for tc in m["tool_calls"]
        ]
    return out | {key: m[key] for key in ("tool_call_id", "name") if m.get(key)}


def normalize_message(m: dict[str, Any]) -> dict[str, Any]:
    """The parts of a message that matter for prompt identity, in a comparable form."""
    out = template_message(m) | {"content": text_of(m.get("content")).strip()}
    if "tool_calls" in out:  # a call's id is the gateway's, not the model's
        out["tool_calls"] = [tc["function"] for tc in out["tool_calls"]]
    return out


@dataclass
class CallRecord:
    """What the gateway remembers of one call, to extend it exactly later in the same episode."""

    call_id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    prompt_ids: list[int]
    output_ids: list[int]
    response: dict[str, Any]
    norm: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.norm = [normalize_message(m) for m in self.messages]


TOOL_PROMPTS = ("auto", "template", "hermes")
"""How tools reach the model: its chat template, or the gateway's Hermes system prompt."""

_PROBE_TOOL = "swarmrl_probe_tool_5c1e"


def renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template puts a request's `tools` into the prompt."""
    probe = [{"type": "function", "function": {"name": _PROBE_TOOL, "parameters": {"type": "object"}}}]
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=probe, tokenize=False)
    except Exception:  # a template that cannot render tools at all ignores them too
        return False
    return _PROBE_TOOL in text


def hermes_messages(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """Plain chat messages that carry `tools`, earlier tool calls and tool results as Hermes text."""
    out = []
    for m in map(template_message, messages):
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = [
                f"<tool_call>\n{json.dumps({'name': c['function']['name'], 'arguments': c['function']['arguments']})}\n</tool_call>"
                for c in m["tool_calls"]
            ]
            out.append({"role": "assistant", "content": "\n".join(filter(None, [m["content"], *calls]))})
        elif m["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    if tools:
        listed = "\n".join(json.dumps(t.get("function", t)) for t in tools)
        prompt = (
            "You can call functions to help with the request. They are listed here as JSON:\n"
            f"<tools>\n{listed}\n</tools>\n"
            "To call one, reply with its name and arguments as a JSON object inside <tool_call></tool_call> "
            'tags:\n<tool_call>\n{"name": "<function name>", "arguments": {<arguments as JSON>}}\n</tool_call>'
        )
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


class PromptBuilder:
    """Turns OpenAI messages into engine input ids for one model's tokenizer."""

    def __init__(self, tokenizer: Any, tool_prompt: str = "auto") -> None:
        if tool_prompt not in TOOL_PROMPTS:
            raise ValueError(f"tool_prompt {tool_prompt!r} is not one of {', '.join(TOOL_PROMPTS)}")
        self.tok = tokenizer
        self.stop_texts = {tid: tokenizer.convert_ids_to_tokens(tid) for tid in stop_token_ids(tokenizer)}
        self.hermes = tool_prompt == "hermes" or (tool_prompt == "auto" and not renders_tools(tokenizer))
        """The gateway writes tools into the prompt itself (`hermes_messages`)."""

    def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, gen_prompt: bool
    ) -> str:
        if self.hermes:
            plain, tools = hermes_messages(messages, tools), None
        else:
            plain = [template_message(m) for m in messages]
        return self.tok.apply_chat_template(
            plain, tools=tools or None, add_generation_prompt=gen_prompt, tokenize=False
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def build(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], history: list[CallRecord]
    ) -> tuple[list[int], str | None]:
        """Prompt ids for `messages`, and the id of the earlier call they extend exactly (None: fresh)."""
        norm = [normalize_message(m) for m in messages]
        for rec in reversed(history):
            k = len(rec.messages)
            extends = len(messages) > k and rec.tools == tools and norm[:k] == rec.norm
            if not extends or norm[k] != normalize_message(rec.response):
                continue
            tail = self._tail_ids(messages, tools, rec)
            if tail is not None:
                return rec.prompt_ids + rec.output_ids + tail, rec.call_id
        return self.encode(self.render(messages, tools, gen_prompt=True)), None

    def _tail_ids(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], rec: CallRecord
    ) -> list[int] | None:
        """Token ids of everything after `rec`'s reply, or None if the template does not allow reuse."""
        k = len(rec.messages)
        marked = [*messages[:k], {"role": "assistant", "content": PLACEHOLDER}, *messages[k + 1 :]]
        text = self.render(marked, tools, gen_prompt=True)
        at = text.find(PLACEHOLDER)
        # Reuse only where the text before the reply is what the earlier prompt rendered (whitespace
        # between them, as Mistral's templates put, belongs to the reply the model wrote).
        before = self.render(rec.messages, tools, gen_prompt=True)
        if at < 0 or not text.startswith(before) or text[len(before) : at].strip():
            return None
        after = text[at + len(PLACEHOLDER) :]
        last = rec.output_ids[-1] if rec.output_ids else None
        stop_text = self.stop_texts.get(last) if last is not None else None
        if stop_text and after.startswith(stop_text):
            after = after[len(stop_text) :]  # the generated stop token already closes the turn
        return self.encode(after)


def stop_token_ids(tokenizer: Any) -> list[int]:
    """Ids that end an assistant turn: eos, plus each of `TURN_ENDS` that is one token of the vocabulary."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    for token in TURN_ENDS:
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid >= 0 and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return sorted(ids)
