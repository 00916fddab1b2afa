"""The tasks, pure environment logic (no NATS, no LLM calls): `TASKS[name]` is a `TaskSpec`.

Built in:
guess_number     multi-turn game: guess a secret in [1, n] from higher / lower feedback
calculator       tool use: call `calculator(expression)`, then answer with the number
team_calculator  two roles: a caller calls the calculator, a reporter answers with its result

A swarm description's own tasks (`data = [...]`: `dataset.py`) are added with `register` in each
process that plays them.
"""

from swarmrl.agents.tasks import calculator, guess_number, team_calculator
from swarmrl.agents.tasks.base import TaskSpec

TASKS: dict[str, TaskSpec] = {
    spec.name: spec for spec in (guess_number.SPEC, calculator.SPEC, team_calculator.SPEC)
}


BUILTIN = frozenset(TASKS)


def register(spec: TaskSpec) -> None:
    """Add (or replace) a task of the user's own; a built-in task's name is refused."""
    if spec.name in BUILTIN:
        raise ValueError(f"task {spec.name!r} is a built-in task: name yours otherwise")
    TASKS[spec.name] = spec


def get_task(name: str) -> TaskSpec:
    """The task registered as `name`; the error lists the known names."""
    try:
        return TASKS[name]
    except KeyError:
        raise KeyError(f"unknown task {name!r}; known: {sorted(TASKS)}") from None
