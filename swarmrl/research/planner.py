"""The planner: an OpenAI-compatible LLM writes a study file from a topic.

The prompt shows the commented template, every `swarmrl up` knob a study may turn, the tasks, the
named metrics and the ledger views. The reply is validated exactly as a hand-written study; when it is
invalid the errors go back to the model, up to `attempts` times. The conversation is kept in
`planner.jsonl`.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from swarmrl.overrides import spec
from swarmrl.research.study import KNOBS, PRESETS, RESERVED, TEMPLATE, Study, StudyError, load_study_text

log = logging.getLogger("swarmrl.research")
_FENCE = re.compile(r"```(?:toml)?\s*\n(.*?)```", re.S)


class PlannerError(RuntimeError):
    """The planner gave no valid study (or could not be reached)."""


def system_prompt() -> str:
    from swarmrl.agents.tasks import TASKS
    from swarmrl.services.ledger.query import VIEW_HELP

    metrics = "\n".join(f"- {name}: {what}" for name, (what, _) in PRESETS.items())
    views = "\n".join(f"- {name}: {what}" for name, what in VIEW_HELP.items())
    knobs = "\n".join(f"- {flag.replace('_', '-')}: {spec(flag)[2]}" for flag in sorted(KNOBS))
    return f"""You design reinforcement-learning studies for swarmrl, which trains the LLMs behind agents.
A study compares arms (changes to a baseline swarm) over several seeds; each arm x seed is one
`swarmrl up` run with a time budget, measured by one metric from the run's ledger.

Reply with the complete study file in one ```toml block, following this commented template:

{TEMPLATE}
The knobs: `swarmrl up` flags an arm or the baseline may set (TOML keys without the dashes):
{knobs}
Never set these, research sets them: {", ".join(sorted(k.replace("_", "-") for k in RESERVED if k != "help"))}.

Built-in tasks: {", ".join(sorted(TASKS))}.
Named metrics ([metric] use = ...):
{metrics}
Or [metric] sql = one SELECT returning one row and one numeric column over these DuckDB views:
{views}
(evals columns: model, step, task, success_rate, n, temperature, metric ('success' for the task outcome), ts).

Keep it small enough to run: runs x run_minutes within total_minutes, 2-4 arms, 2-5 seeds.
"""


def extract_toml(reply: str) -> str:
    """The TOML of a reply: its ```toml block, else the whole reply."""
    m = _FENCE.search(reply)
    return (m.group(1) if m else reply).strip() + "\n"


def plan(
    topic: str,
    url: str,
    model: str,
    api_key: str,
    root: Path,
    attempts: int = 3,
    transcript: Path | None = None,
) -> tuple[str, Study]:
    """Ask the planner for a study on `topic`; returns (its TOML, the validated study)."""
    import openai

    client = openai.OpenAI(base_url=url, api_key=api_key or "none", timeout=300, max_retries=2)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system_prompt()},
        {"role": "user", "content": f"Topic: {topic}\n\nWrite the study file."},
    ]
    errors = ""
    for attempt in range(1, attempts + 1):
        try:
            reply = client.chat.completions.create(model=model, messages=messages, temperature=0.2)  # type: ignore[arg-type]
        except openai.OpenAIError as exc:
            raise PlannerError(f"planner {url} (model {model}) failed: {exc}") from None
        text = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": text})
        toml_text = extract_toml(text)
        try:
            study = load_study_text(toml_text, root, f"from the planner (reply {attempt})")
        except StudyError as exc:
            errors = str(exc)
            log.warning("planner reply %d is not a valid study:\n%s", attempt, errors)
            fix = "Reply with the whole corrected file in one ```toml block."
            messages.append({"role": "user", "content": f"That study file is invalid:\n{errors}\n\n{fix}"})
            continue
        finally:
            if transcript is not None:
                transcript.write_text("".join(json.dumps(m) + "\n" for m in messages))
        log.info("planner reply %d is a valid study: %s", attempt, study.question)
        return toml_text, study
    raise PlannerError(f"the planner gave no valid study in {attempts} replies; the last errors:\n{errors}")
