"""Environments in user code: `env = "file.py:Class"` in a `[tasks.<name>]` table.

The class has the shape of the built-in tasks' environments (`base.Env`), built from one instance:

    class Guess:
        tools = ["guess"]                        # optional: methods (or functions) the model may call

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

Instances are the rows of `data`, else the class's `train_instances(seed) -> Iterator[dict]` and
`eval_instances() -> list[dict]`; an instance's `task_id` is its `task_id` key, else a hash of it.

Tools' type hints and Google-style docstrings become their OpenAI tool specs. A reply with tool
calls runs them (each result, or `error: ...`, goes back as a `tool` message) without calling `step`.
An episode ends when `step` says so, or after `max_turns` model calls.

A team environment names its `roles` and has the shape of `base.MultiRoleEnv`: `turn()` gives the
next `(role, messages)` (None once over), `step(reply)` takes that role's reply, then `rewards`
(role -> reward), `success`, optionally `done` and `metrics`; `tools` is a list for every role, or a
dict role -> list.

With `sandbox = true` the tools run as python actions: the environment's file, run as a program
calling the named function, so they must be plain functions of a file that needs only the stdlib.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from swarmrl.agents.config import TaskConf
from swarmrl.agents.tasks.base import Message, StepResult, TaskSpec, Turn, message_text
from swarmrl.agents.tasks.dataset import DataRow, DatasetError, load_object, load_rows, train_stream

PROBE_REPLY = {"role": "assistant", "content": "0"}  # the start-up probe's reply


def tool_spec(fn: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI tool spec of `fn` from its type hints and docstring."""
    from transformers.utils import get_json_schema

    spec = get_json_schema(fn)
    spec["function"].pop("return", None)  # not in OpenAI's tool format
    return spec


def run_tool(
    tools: dict[str, Callable[..., Any]], call: dict[str, Any], result: str | None = None
) -> Message:
    """The `tool` message answering `call`: `result` when the sandbox ran it, else the tool run here."""
    fn = call.get("function") or {}
    name = fn.get("name", "")
    if result is None:
        try:
            if name not in tools:
                raise ValueError(f"no tool {name!r}; tools: {sorted(tools)}")
            args = fn.get("arguments") or "{}"
            out = tools[name](**(json.loads(args) if isinstance(args, str) else args))
            result = out if isinstance(out, str) else json.dumps(out)
        except Exception as exc:  # the model's bad call, or the tool's own failure: the model sees it
            result = f"error: {type(exc).__name__}: {exc}"
    return {"role": "tool", "tool_call_id": call.get("id", ""), "name": name, "content": result}


def as_messages(opening: str | list[Message]) -> list[Message]:
    """An environment's opening: a string is one user message."""
    return [{"role": "user", "content": opening}] if isinstance(opening, str) else list(opening)


class _UserEpisode:
    """One episode of an environment task: the user's environment, plus the tool loop and turn cap."""

    def __init__(self, task: EnvTask, row: DataRow) -> None:
        self.task, self.row = task, row
        self.env = task.cls(dict(row.columns))

    @property
    def success(self) -> bool:
        return bool(self.env.success)


class UserEnv(_UserEpisode):
    """A single-agent environment's episode."""

    def __init__(self, task: EnvTask, row: DataRow) -> None:
        super().__init__(task, row)
        self.tools = task.bind_tools(self.env)
        self.tool_specs = task.tool_specs
        self.turns = 0

    @property
    def reward(self) -> float:
        return float(self.env.reward)

    def reset(self) -> list[Message]:
        return as_messages(self.env.reset())

    def step(self, reply: Message, tool_results: list[str | None] | None = None) -> StepResult:
        """`tool_results`: the tool calls' results from the sandbox (None: run here)."""
        self.turns += 1
        calls = reply.get("tool_calls") or []
        if calls and self.tools:
            results = tool_results or [None] * len(calls)
            messages = [
                run_tool(self.tools, call, result) for call, result in zip(calls, results, strict=True)
            ]
            return StepResult(messages, done=self.turns >= self.task.conf.max_turns)
        out = self.env.step(reply)
        result = out if isinstance(out, StepResult) else StepResult(list(out[0]), bool(out[1]))
        if self.turns >= self.task.conf.max_turns:
            result.done = True
        return result


class UserTeamEnv(_UserEpisode):
    """A team environment's episode: each role's tool loop."""

    def __init__(self, task: EnvTask, row: DataRow) -> None:
        super().__init__(task, row)
        self.tools = {role: task.bind_tools(self.env, role) for role in task.roles}
        self.calls = 0
        self.pending: Turn | None = None  # the turn being played, grown by each tool round

    @property
    def done(self) -> bool:
        return bool(getattr(self.env, "done", False)) or self.calls >= self.task.conf.max_turns

    @property
    def rewards(self) -> dict[str, float]:
        return {role: float(value) for role, value in (self.env.rewards or {}).items()}

    @property
    def metrics(self) -> dict[str, float]:
        return dict(getattr(self.env, "metrics", None) or {})

    def turn(self) -> Turn | None:
        if self.pending is None:
            if self.done or (nxt := self.env.turn()) is None:
                return None
            role, opening = (nxt.role, nxt.messages) if isinstance(nxt, Turn) else nxt
            if role not in self.tools:
                raise ValueError(
                    f"env {self.task.conf.env} gave a turn to {role!r}; its roles are {self.task.roles}"
                )
            self.pending = Turn(role, as_messages(opening), self.task.role_specs.get(role))
        return self.pending

    def step(self, reply: Message) -> None:
        assert self.pending is not None, "step() before turn()"
        self.calls += 1
        turn, tools = self.pending, self.tools[self.pending.role]
        calls = reply.get("tool_calls") or []
        if calls and tools and self.calls < self.task.conf.max_turns:
            turn.messages.extend([reply, *(run_tool(tools, call) for call in calls)])
            return  # the same role goes on with its tools' results
        self.pending = None
        self.env.step(reply)


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
                        f"task {name}: env {conf.env} needs data = [...] or a {method}() method "
                        "to draw instances from"
                    )
            self.eval = [self._row(inst) for inst in self.cls.eval_instances()]
            self.train_tasks = lambda seed: (self._row(inst) for inst in self.cls.train_instances(seed))
        if not self.eval:
            raise DatasetError(f"task {name}: env {conf.env} has no held-out instances")
        # The specs come from a probe episode: a class that does not build fails at start.
        self.roles: tuple[str, ...] = tuple(getattr(self.cls, "roles", None) or ())
        probe = self._probe()
        tools = self.bind_tools(probe)
        self.tool_specs = [tool_spec(fn) for fn in tools.values()] or None
        self.tool_names = frozenset(tools)
        self.role_specs = {
            role: [tool_spec(fn) for fn in self.bind_tools(probe, role).values()] or None
            for role in self.roles
        }
        if conf.sandbox and self.roles:
            raise DatasetError(f"task {name}: sandbox = true is for single-agent envs; {conf.env} has roles")
        self.program = self._sandbox_program(tools) if conf.sandbox else ""

    def _probe(self) -> Any:
        """One instance, checked for the shape an episode needs (a single-agent one is reset and
        stepped once), so a missing piece stops the run at start."""
        where = f"task {self.name}: env {self.conf.env}"
        needed = ("turn", "step") if self.roles else ("reset", "step")
        if missing := [m for m in needed if not callable(getattr(self.cls, m, None))]:
            raise DatasetError(
                f"{where} has no {' or '.join(f'{m}()' for m in missing)} method "
                "(see agents/tasks/environment.py)"
            )
        probe = self.cls(dict(self.eval[0].columns))
        if self.roles:
            return probe
        try:
            opening = probe.reset()
            out = probe.step(dict(PROBE_REPLY))
        except Exception as exc:
            raise DatasetError(
                f"{where}: reset() then step({PROBE_REPLY}) on {self.eval[0].task_id} raised "
                f"{type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(opening, str | list):
            raise DatasetError(f"{where}: reset() returned {opening!r}: need a list of messages or a string")
        if not isinstance(out, StepResult) and not (isinstance(out, tuple | list) and len(out) == 2):
            raise DatasetError(f"{where}: step() returned {out!r}: need (messages to add, done)")
        for name, kind in (("reward", float), ("success", bool)):
            if not hasattr(probe, name) and name not in getattr(self.cls, "__annotations__", {}):
                raise DatasetError(f"{where} has no {name!r} attribute: need `{name}: {kind.__name__}`")
            try:
                kind(getattr(probe, name)) if hasattr(probe, name) else None
            except (TypeError, ValueError) as exc:
                raise DatasetError(
                    f"{where}: {name} = {getattr(probe, name)!r} is not a {kind.__name__} ({exc})"
                ) from None
        return probe

    def _sandbox_program(self, tools: dict[str, Callable[..., Any]]) -> str:
        """The tools' file plus a main that runs one tool call read from stdin."""
        if not tools:
            raise DatasetError(f"task {self.name}: sandbox = true, but env {self.conf.env} has no tools")
        files = {name: fn.__code__.co_filename for name, fn in tools.items() if inspect.isfunction(fn)}
        if len(files) < len(tools) or len(set(files.values())) > 1:
            odd = sorted(set(tools) - set(files)) or sorted(files)
            raise DatasetError(
                f"task {self.name}: sandbox = true runs plain functions of one file; {odd} are methods or "
                "come from several files (a method needs the episode's state, which stays in the client): "
                "make them functions of the environment's file, or drop sandbox"
            )
        return Path(next(iter(files.values()))).read_text() + SANDBOX_MAIN

    def tool_actions(self, reply: Message) -> list[dict[str, Any] | None]:
        """Per tool call of `reply`, the python action that runs it (None: not one of its tools)."""
        out: list[dict[str, Any] | None] = []
        for call in reply.get("tool_calls") or []:
            fn = call.get("function") or {}
            args = fn.get("arguments") or "{}"
            stdin = json.dumps({"name": fn.get("name"), "arguments": args})
            out.append({"code": self.program, "stdin": stdin} if fn.get("name") in self.tool_names else None)
        return out

    def _row(self, instance: dict[str, Any]) -> DataRow:
        key = instance.get("task_id") or hashlib.sha1(
            json.dumps(instance, sort_keys=True, default=str).encode()
        )
        task_id = key if isinstance(key, str) else f"{self.name}-{key.hexdigest()[:12]}"
        return DataRow(task_id, instance)

    def bind_tools(self, env: Any, role: str | None = None) -> dict[str, Callable[..., Any]]:
        """The class's `tools` (for `role` when a dict): methods bound to `env`, or functions."""
        out: dict[str, Callable[..., Any]] = {}
        tools = getattr(self.cls, "tools", None) or []
        if isinstance(tools, dict):
            tools = tools.get(role, []) if role is not None else []
        for tool in tools:
            fn = getattr(env, tool) if isinstance(tool, str) else tool
            out[fn.__name__] = fn
        return out

    def spec(self) -> TaskSpec:
        # a team's models are the user's: they need no warm start
        team: dict[str, Any] = {"roles": self.roles, "role_demonstrations": lambda row, rng: {}}
        return TaskSpec(
            name=self.name,
            max_tokens=None,  # the environment's author says (TaskConf.max_tokens)
            make_env=lambda row: (UserTeamEnv if self.roles else UserEnv)(self, row),
            train_tasks=self.train_tasks,
            eval_tasks=lambda: list(self.eval),
            demonstration=None,
            parse_reply=message_text,
            tool_actions=self.tool_actions if self.conf.sandbox else None,
            **(team if self.roles else {}),
        )


SANDBOX_MAIN = """

if __name__ == "__main__":  # swarmrl: run one tool call from stdin, print its result
    import json as _json
    import sys as _sys

    _call = _json.loads(_sys.stdin.read())
    _args = _call["arguments"]
    try:
        _result = globals()[_call["name"]](**(_json.loads(_args) if isinstance(_args, str) else _args))
        print(_result if isinstance(_result, str) else _json.dumps(_result))
    except Exception as _exc:  # the model's bad call, or the tool's own failure: the model sees it
        print(f"error: {type(_exc).__name__}: {_exc}")
"""
"""Appended to the environment's file to make the sandboxed program."""


def env_task(name: str, conf: TaskConf) -> TaskSpec:
    """The `TaskSpec` of environment task `name` (its class imported, its instances drawn)."""
    task = EnvTask(name, conf)
    single = not task.roles and set(conf.roles) <= {"agent"}  # `agent`: a single agent's default role
    if not single and set(conf.roles) != set(task.roles):
        want = ", ".join(f'{r} = "<model>"' for r in task.roles)
        raise DatasetError(
            f"task {name}: env {conf.env} has roles {list(task.roles)}, the description {sorted(conf.roles)}"
            + (f"; give roles = {{{want}}}" if task.roles else "; a single-agent env takes no roles")
        )
    if next(iter(task.train_tasks(0)), None) is None:
        raise DatasetError(f"task {name}: env {conf.env} has no training instances")
    return task.spec()
