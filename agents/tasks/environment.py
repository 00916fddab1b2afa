"""Environments in user code: `env = "file.py:Class"` in a `[tasks.<name>]` table.

The class has the shape of the built-in tasks' environments (`base.Env`), built from one instance:

    class Guess:
        tools = ["guess"]                        # optional: its methods (or plain functions) the model may call

        def __init__(self, instance: dict): ...  # one row of `data`, or one of `train_instances(seed)`
        def reset(self) -> list[dict] | str: ... # the opening messages (a string: one user message)
        def step(self, reply: dict): ...         # the assistant message -> StepResult, or (messages, done)
        reward: float                            # final once done
        success: bool

        def guess(self, n: int) -> str:
            '''Guess the secret number.

            Args:
                n: your guess
            '''

Instances come from `data` (rows, the dataset task's files and splits) or, without it, from the
class: `train_instances(seed) -> Iterator[dict]` and `eval_instances() -> list[dict]` (static or
class methods); an instance's `task_id` is its `task_id` key, else a hash of it.

Tools are plain Python callables; their type hints and Google-style docstrings become the OpenAI tool
specs (`transformers.utils.get_json_schema`). A reply with tool calls runs them in-process (each
result, or `error: ...`, goes back as a `tool` message) and the episode goes on without calling
`step`; a reply without tool calls goes to `step`. An episode ends when `step` says so, or after
`max_turns` model calls. Sandboxed tools (`sandbox = true`, through the actions service) are not
built yet.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from typing import Any

from swarmrl.agents.config import TaskConf
from swarmrl.agents.tasks.base import Message, StepResult, TaskSpec, message_text
from swarmrl.agents.tasks.dataset import DataRow, DatasetError, load_object, load_rows, train_stream


def tool_spec(fn: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI tool spec of `fn` from its type hints and docstring."""
    from transformers.utils import get_json_schema

    spec = get_json_schema(fn)
    spec["function"].pop("return", None)  # not part of OpenAI's tool format
    return spec


class UserEnv:
    """One episode of an environment task: the user's environment, plus the tool loop and turn cap."""

    def __init__(self, task: EnvTask, row: DataRow) -> None:
        self.task, self.row = task, row
        self.env = task.cls(dict(row.columns))
        self.tools = task.bind_tools(self.env)
        self.tool_specs = task.tool_specs
        self.turns = 0

    @property
    def reward(self) -> float:
        return float(self.env.reward)

    @property
    def success(self) -> bool:
        return bool(self.env.success)

    def reset(self) -> list[Message]:
        opening = self.env.reset()
        return [{"role": "user", "content": opening}] if isinstance(opening, str) else list(opening)

    def step(self, reply: Message) -> StepResult:
        self.turns += 1
        calls = reply.get("tool_calls") or []
        if calls and self.tools:
            messages = [self._run_tool(call) for call in calls]
            return StepResult(messages, done=self.turns >= self.task.conf.max_turns)
        out = self.env.step(reply)
        result = out if isinstance(out, StepResult) else StepResult(list(out[0]), bool(out[1]))
        if self.turns >= self.task.conf.max_turns:
            result.done = True
        return result

    def _run_tool(self, call: dict[str, Any]) -> Message:
        fn = call.get("function") or {}
        name = fn.get("name", "")
        try:
            if name not in self.tools:
                raise ValueError(f"no tool {name!r}; tools: {sorted(self.tools)}")
            args = fn.get("arguments") or "{}"
            result = self.tools[name](**(json.loads(args) if isinstance(args, str) else args))
            content = result if isinstance(result, str) else json.dumps(result)
        except Exception as exc:  # the model's bad call, or the tool's own failure: the model sees it
            content = f"error: {type(exc).__name__}: {exc}"
        return {"role": "tool", "tool_call_id": call.get("id", ""), "name": name, "content": content}


class EnvTask:
    """An environment task: the user's class, its instances, its tools."""

    def __init__(self, name: str, conf: TaskConf) -> None:
        self.name, self.conf = name, conf
        self.cls = load_object(conf.env, "env")
        if conf.data:
            self.train, self.eval = load_rows(name, conf)
            self.train_tasks: Callable[[int], Iterator[DataRow]] = lambda seed: train_stream(self.train, seed)
        else:
            for method in ("train_instances", "eval_instances"):
                if not callable(getattr(self.cls, method, None)):
                    raise DatasetError(
                        f"task {name}: env {conf.env} needs data = [...] or a {method}() method to draw instances from"
                    )
            self.eval = [self._row(inst) for inst in self.cls.eval_instances()]
            self.train_tasks = lambda seed: (self._row(inst) for inst in self.cls.train_instances(seed))
        if not self.eval:
            raise DatasetError(f"task {name}: env {conf.env} has no held-out instances")
        # Built once from a probe episode (fails at start, not in a client, if the class does not
        # build or a tool has no spec): the specs are the class's, the same in every episode.
        probe = self.cls(dict(self.eval[0].columns))
        probe.reset()
        self.tool_specs = [tool_spec(fn) for fn in self.bind_tools(probe).values()] or None

    def _row(self, instance: dict[str, Any]) -> DataRow:
        key = instance.get("task_id") or hashlib.sha1(
            json.dumps(instance, sort_keys=True, default=str).encode()
        )
        task_id = key if isinstance(key, str) else f"{self.name}-{key.hexdigest()[:12]}"
        return DataRow(task_id, instance)

    def bind_tools(self, env: Any) -> dict[str, Callable[..., Any]]:
        """`tools` of the class: method names (bound to this episode's environment) or functions."""
        out: dict[str, Callable[..., Any]] = {}
        for tool in getattr(self.cls, "tools", None) or []:
            fn = getattr(env, tool) if isinstance(tool, str) else tool
            out[fn.__name__] = fn
        return out

    def spec(self) -> TaskSpec:
        return TaskSpec(
            name=self.name,
            max_tokens=None,  # the environment's author says (TaskConf.max_tokens)
            make_env=lambda row: UserEnv(self, row),
            train_tasks=self.train_tasks,
            eval_tasks=lambda: list(self.eval),
            demonstration=None,
            parse_reply=message_text,
        )


def env_task(name: str, conf: TaskConf) -> TaskSpec:
    """The `TaskSpec` of environment task `name` (its class imported, its instances drawn)."""
    task = EnvTask(name, conf)
    if next(iter(task.train_tasks(0)), None) is None:
        raise DatasetError(f"task {name}: env {conf.env} has no training instances")
    return task.spec()
