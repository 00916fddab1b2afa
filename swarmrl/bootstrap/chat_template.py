"""The tiny model's chat template: ChatML with Qwen2.5's tool conventions, so the gateway code that
drives the tiny model also drives a real Qwen2.5-Instruct (which brings its own template).

    <|im_start|>system\\n{system}\\n\\n# Tools ... <tools>\\n{tool json}\\n</tools> ...<|im_end|>\\n
    <|im_start|>user\\n{content}<|im_end|>\\n
    <|im_start|>assistant\\n{content}\\n<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call><|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n{content}\\n</tool_response><|im_end|>\\n      (a `tool` message)
    <|im_start|>assistant\\n                                                     (generation prompt)

Two deliberate differences from Qwen2.5's own template keep it prefix-stable (rendering messages[:k]
is a string prefix of rendering messages[:k+1], which token-exact capture relies on): each `tool`
message is its own user turn (Qwen groups consecutive ones), and no default system prompt is invented.
Tool-call arguments may be a dict or an already-encoded JSON string; both render the same JSON.
"""

from __future__ import annotations

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

# Jinja whitespace is controlled explicitly with `-` everywhere; transformers also sets
# trim_blocks/lstrip_blocks, so the indentation below never reaches the output.
CHAT_TEMPLATE = (
    """
{%- macro text(content) -%}
  {%- if content is none -%}
  {%- elif content is string -%}{{- content -}}
  {%- else -%}{%- for part in content -%}{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}{%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- if messages and tools -%}
  {{- '<|im_start|>system\\n' -}}
  {%- if messages[0].role == 'system' -%}{{- text(messages[0].content) + '\\n\\n' -}}{%- endif -%}
  {{- '"""
    + TOOLS_PREAMBLE.replace("\n", "\\n")
    + """' -}}
  {%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}
  {{- '"""
    + TOOLS_POSTAMBLE.replace("\n", "\\n")
    + """<|im_end|>\\n' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- if message.role == 'system' and loop.first and tools -%}
  {%- elif message.role == 'assistant' -%}
    {{- '<|im_start|>assistant' -}}
    {%- if message.tool_calls -%}
      {%- if text(message.content) -%}{{- '\\n' + text(message.content) -}}{%- endif -%}
      {%- for call in message.tool_calls -%}
        {%- if call.function is defined -%}{%- set call = call.function -%}{%- endif -%}
        {{- '\\n<tool_call>\\n{"name": "' + call.name + '", "arguments": ' -}}
        {%- if call.arguments is string -%}{{- call.arguments -}}{%- else -%}{{- call.arguments | tojson -}}{%- endif -%}
        {{- '}\\n</tool_call>' -}}
      {%- endfor -%}
    {%- else -%}
      {{- '\\n' + text(message.content) -}}
    {%- endif -%}
    {{- '<|im_end|>\\n' -}}
  {%- elif message.role == 'tool' -%}
    {{- '<|im_start|>user\\n<tool_response>\\n' + text(message.content) + '\\n</tool_response><|im_end|>\\n' -}}
  {%- else -%}
    {{- '<|im_start|>' + message.role + '\\n' + text(message.content) + '<|im_end|>\\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""
).strip()
