"""The swarm description: which models train, which tasks their agents play, how many clients run.

Read from a TOML file (`--config swarm.toml`) or built from `up`'s flags, which override the file;
validated before any process starts, every error naming the offending entry.

    [run]                          # budget and evaluation (all optional)
    minutes = 20
    [models.caller]                # one table per trainable model (name = subject token)
    base = "tiny"                  # a bootstrap preset, a shipped model, a GGUF file or an HF model dir
    [models.caller.trainer]        # any `swarmrl serve trainer` setting (`--help`)
    lr = 1e-4
    [tasks.calculator]             # one table per task (a built-in task, or your own)
    clients = 2                    # client processes playing it; `roles`: role (agent) -> model
    [gateway]                      # likewise [merger], [ledger], [actions], [tracker], [replicas]
    max_backlog = 64

More in `examples/` (`team.toml`: a two-model team). The tables are the services' settings classes
(`services/<name>/config.py`), where every setting is declared once with its default and docstring.
A process gets `service_config`: its service's config class with the description's settings, what
the run derives and where it runs; `up` writes it to `<run dir>/config/<process>.json`.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, model_validator

from swarmrl.agents.config import RunConf, TaskConf
from swarmrl.core.config import ServiceConfig, Strict, SwarmConfigError, error_lines
from swarmrl.services.actions.config import ActionsConfig, ActionsSettings
from swarmrl.services.engine.config import EngineConfig, EngineSettings
from swarmrl.services.gateway.config import GatewayConfig, GatewaySettings
from swarmrl.services.ledger.config import LedgerConfig, LedgerSettings
from swarmrl.services.merger.config import MergerConfig, MergerSettings
from swarmrl.services.tracker.config import TrackerConfig, TrackerSettings
from swarmrl.services.trainer.config import TrainerConfig, TrainerSettings

_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ModelConf(Strict):
    """One trainable model: its base weights, and the settings of its engine and its trainer."""

    base: str = "tiny"
    """Bootstrap preset (`tiny`, `tiny-llama`, `tiny-h32`; built offline), a shipped model
    (`smollm2-135m-instruct`, `gemma3-270m`: `just real-models`), a `.gguf` file, an HF model
    directory, or a hub id."""
    warm_start: list[str] | None = None
    """SFT sources of a preset's warm start (`calculator`, `team_calculator.caller`); None = the preset's own."""
    warm_start_steps: int | None = Field(default=None, ge=0)
    """SFT steps of a preset's warm start; None = the preset's default for its sources."""
    trainer: TrainerSettings = Field(default_factory=TrainerSettings)
    """Settings of this model's trainer (`swarmrl serve trainer --help`), e.g. {lr = 1e-4}."""
    trainer_processes: int = Field(default=1, ge=1)
    """Processes of this model's trainer: more than 1 runs it under `accelerate launch` (DDP), each
    training a share of every step."""
    engine: EngineSettings = Field(default_factory=EngineSettings)
    """Settings of this model's engine (`swarmrl serve engine --help`), e.g. {max_batch = 32}."""
    share_engine: str | None = None
    """Serve this model from model X's engine as another LoRA adapter of the same base (both train
    LoRA from the same base; this one has no engine settings of its own)."""


CONFIGS: dict[str, type[ServiceConfig]] = {
    "trainer": TrainerConfig, "engine": EngineConfig, "gateway": GatewayConfig, "merger": MergerConfig,
    "ledger": LedgerConfig, "tracker": TrackerConfig, "actions": ActionsConfig,
}  # fmt: skip
"""Each service's process configuration: its settings (what a description sets) and its placement."""


class Replicas(Strict):
    """`[replicas]`: processes per service, sharing its work through NATS (`examples/replicas.toml`)."""

    merger: int = Field(default=1, ge=1, le=16)
    """Merger processes. They share the 16 episode partitions by leases in NATS KV; a dead one's
    partitions are taken over once its leases expire."""
    ledger: int = Field(default=1, ge=1, le=17)
    """Ledger processes. More than one share the episode partitions (stream LEDGER_PARTS) and the
    other streams by lease, each writing its partitions under `<table>/p<partition>/` of the run dir."""
    gateway: int = Field(default=1, ge=1, le=16)
    """Gateway processes: one queue group for token requests, admitting groups and mixing tasks as
    one (`services/gateway/admission.py`)."""
    trainer: int = Field(default=1, ge=1, le=4)
    """Trainer processes per model: the lead lease's holder trains, the others stand by with the
    model loaded and take over from its newest checkpoint (`services/trainer/lead.py`)."""
    engine: int = Field(default=1, ge=1, le=16)
    """Engine processes per model (per base, for models sharing one): a pool at every gateway, which
    spreads calls by load and keeps an episode on one engine (`services/gateway/pool.py`)."""


class Swarm(Strict):
    run: RunConf = RunConf()
    replicas: Replicas = Replicas()
    models: dict[str, ModelConf]
    tasks: dict[str, TaskConf]
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    """Settings of the gateway (`swarmrl serve gateway --help`), e.g. {max_backlog = 64}."""
    merger: MergerSettings = Field(default_factory=MergerSettings)
    """Settings of the merger (`swarmrl serve merger --help`)."""
    ledger: LedgerSettings = Field(default_factory=LedgerSettings)
    """Settings of the ledger (`swarmrl serve ledger --help`)."""
    tracker: TrackerSettings = Field(default_factory=TrackerSettings)
    """Settings of the metrics exporter (`swarmrl serve tracker --help`), e.g. {track = ["tensorboard"]}."""
    actions: ActionsSettings = Field(default_factory=ActionsSettings)
    """Settings of the actions service (`swarmrl serve actions --help`); its policy is `run.actions`."""

    @model_validator(mode="after")
    def _check(self) -> Swarm:
        from swarmrl.agents.tasks import BUILTIN, TASKS

        if not self.models:
            raise ValueError("no [models.<name>] table: a swarm trains at least one model")
        if not self.tasks:
            raise ValueError("no [tasks.<name>] table: a swarm plays at least one task")
        for name in [*self.models, *self.tasks]:
            if not _NAME_RE.match(name):
                raise ValueError(f"name {name!r} must be 1-64 of [A-Za-z0-9_-] (it becomes a NATS subject)")
        for name, task in self.tasks.items():
            spec = None if task.own else TASKS.get(name)
            if task.own and name in BUILTIN:
                raise ValueError(f"[tasks.{name}]: {name} is a built-in task; name your own task otherwise")
            if spec is None and task.command is None and not task.own and task.clients > 0:
                raise ValueError(
                    f"[tasks.{name}]: unknown built-in task; known: {sorted(TASKS)} (a task of your "
                    "own needs `data` and `reward`, an `env` or a `command`; one outside agents "
                    "play, `clients = 0`)"
                )
            if not task.roles:
                if spec is not None and spec.roles:
                    raise ValueError(
                        f"[tasks.{name}]: roles {list(spec.roles)} each need a model: roles = {{...}}"
                    )
                if len(self.models) != 1:
                    raise ValueError(
                        f'[tasks.{name}]: roles = {{agent = "<model>"}} is needed with several models '
                        f"({sorted(self.models)})"
                    )
                task.roles = {"agent": next(iter(self.models))}
            for role, model in task.roles.items():
                if model not in self.models:
                    raise ValueError(
                        f"[tasks.{name}].roles.{role}: unknown model {model!r}; models: {sorted(self.models)}"
                    )
            if spec is not None and spec.roles and set(task.roles) != set(spec.roles):
                raise ValueError(
                    f"[tasks.{name}].roles: the task's roles are {sorted(spec.roles)}, got {sorted(task.roles)}"
                )
            repeats = {m: self.trainer(m).num_repeat for m in set(task.roles.values())}
            if len(set(repeats.values())) > 1:
                raise ValueError(f"[tasks.{name}]: its models disagree on num_repeat (group size): {repeats}")
        for name, m in self.models.items():
            if m.share_engine is not None:
                self._check_shared(name, m)
            if self.replicas.trainer > 1 and m.trainer_processes > 1:
                raise ValueError(
                    f"[models.{name}]: trainer_processes = {m.trainer_processes} with [replicas] trainer = "
                    f"{self.replicas.trainer}: a standby trainer takes over one training process only"
                )
        unused = set(self.models) - {m for t in self.tasks.values() for m in t.roles.values()}
        if unused:
            raise ValueError(
                f"models {sorted(unused)} are played by no task; give them a role or remove them"
            )
        return self

    def _check_shared(self, name: str, m: ModelConf) -> None:
        where, owner = f"[models.{name}].share_engine", self.models.get(m.share_engine or "")
        if owner is None:
            raise ValueError(f"{where}: unknown model {m.share_engine!r}; models: {sorted(self.models)}")
        if owner.share_engine is not None:
            raise ValueError(
                f"{where}: {m.share_engine} serves from {owner.share_engine}'s engine; name that one"
            )
        if m.engine != EngineSettings():
            raise ValueError(
                f"{where}: the engine is {m.share_engine}'s; set engine settings there, not here"
            )
        for other in (name, str(m.share_engine)):
            if not self.trainer(other).lora_rank:
                raise ValueError(f"{where}: {other} trains all weights; a shared engine serves LoRA adapters "
                                 f"(set [models.{other}.trainer] lora_rank)")  # fmt: skip
        same = ("base", "warm_start", "warm_start_steps")
        if any(getattr(m, f) != getattr(owner, f) for f in same):
            raise ValueError(f"{where}: the two models must have the same {', '.join(same)}")

    def engine_owner(self, model: str) -> str:
        """The model whose engine serves `model` (itself unless it shares another's)."""
        return self.models[model].share_engine or model

    def adapters(self, owner: str) -> list[str]:
        """The LoRA adapters the engine of model `owner` serves (empty: it serves full weights)."""
        return [n for n in self.models if self.engine_owner(n) == owner and self.trainer(n).lora_rank]

    def task_models(self, task: str) -> list[str]:
        """The models of `task`, in role order, without repeats; the first is the task's lead."""
        return list(dict.fromkeys(self.tasks[task].roles.values()))

    def max_tokens(self, task: str) -> int | None:
        """Max tokens per reply in `task` as described (None: the task's own need, `TaskSpec.max_tokens`)."""
        return self.tasks[task].max_tokens or self.run.max_tokens

    def num_repeat(self, task: str) -> int:
        """The GRPO group size of `task`: its lead model's trainer's (all its models agree)."""
        return self.trainer(self.task_models(task)[0]).num_repeat

    def trainer(self, model: str) -> TrainerSettings:
        return self.models[model].trainer

    def backlog(self) -> int:
        """The gateway's admission bound: its own, or (-1) two trainer steps of the tightest model."""
        if self.gateway.max_backlog >= 0:
            return self.gateway.max_backlog
        return min(2 * t.batch_groups * t.num_repeat for t in map(self.trainer, self.models))

    def weights(self) -> dict[str, float]:
        total = sum(t.weight for t in self.tasks.values())
        return {name: t.weight / total for name, t in self.tasks.items()}


def service_config(swarm: Swarm, service: str, model: str | None = None, **placement: Any) -> Any:
    """`service`'s whole configuration (of `model`, for a trainer or engine): the description's
    settings, what the run derives (seed, steps, backlog bound, task weights, actions policy) and
    `placement` (ports, directories, engine URLs)."""
    run, derived = swarm.run, dict[str, Any]()
    if service in ("trainer", "engine"):
        if model not in swarm.models:
            raise SwarmConfigError(f"the {service} of which model? --model is one of {sorted(swarm.models)}")
        settings, derived = getattr(swarm.models[model], service), {"model": model, "seed": run.seed}
        if service == "trainer":
            derived["max_steps"] = run.steps
    else:
        settings = getattr(swarm, service)
    if service == "gateway":
        derived["max_backlog"] = swarm.backlog()
        derived["tasks"] = list(swarm.tasks)
        derived["own_tasks"] = [name for name, t in swarm.tasks.items() if t.clients > 0]
        if len(swarm.tasks) > 1:
            derived["task_weight"] = [f"{t}={w:.6g}" for t, w in swarm.weights().items()]
    if service == "actions" and run.actions != "off":
        derived["policy"] = run.actions
    return CONFIGS[service](**settings.model_dump() | derived | placement)


def check_bases(swarm: Swarm) -> None:
    """Every model's base must be a known preset (with known warm-start sources) or an HF model dir."""
    from swarmrl import models
    from swarmrl.bootstrap.presets import PRESETS, validate_base

    for name, m in swarm.models.items():
        where, path = f"[models.{name}]", Path(m.base).expanduser()
        if m.base in PRESETS:
            try:
                validate_base(m.base, m.warm_start)
            except ValueError as exc:
                raise SwarmConfigError(f"{where}: {exc}") from None
        elif m.warm_start is not None or m.warm_start_steps is not None:
            raise SwarmConfigError(f"{where}: warm_start applies to presets only, base is {m.base}")
        elif models.is_real(m.base):
            models.check(m.base, f"{where}.base")
        elif _HUB_ID.match(m.base) and not path.exists():
            hub_model(m.base, f"{where}.base")  # found in the hub cache or fetched now, or refused
        elif not (path.is_dir() and (path / "config.json").exists()):
            raise SwarmConfigError(
                f"{where}.base: {m.base!r} is neither a preset ({', '.join(sorted(PRESETS))}) "
                "nor an HF model directory (a folder with config.json)"
            )


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def hub_model(repo_id: str, where: str) -> Path:
    """The local directory of hub model `repo_id`: from the Hugging Face cache, else downloaded,
    else a `SwarmConfigError` saying how to bring it in offline."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # not in the cache: try the hub, unless this machine is offline
        pass
    try:
        return Path(snapshot_download(repo_id))
    except Exception as exc:
        raise SwarmConfigError(
            f"{where}: {repo_id!r} looks like a Hugging Face hub id, and it is neither in the local hub cache "
            f"nor downloadable here ({type(exc).__name__}). On a machine that reaches the hub: "
            f'`huggingface-cli download {repo_id} --local-dir DIR`, copy DIR here and set base = "DIR" '
            "(or copy the hub cache and point HF_HUB_CACHE at it)."
        ) from None


def resolve_base(m: ModelConf, build: bool = True) -> Path:
    """`m`'s model directory, building a preset on first use (`build=False`: where it is or will be)."""
    from swarmrl import models
    from swarmrl.bootstrap.presets import PRESETS, ensure_model, model_dir

    if models.is_real(m.base):
        return models.model_dir(m.base, convert=build)
    if m.base in PRESETS:
        return (ensure_model if build else model_dir)(m.base, m.warm_start, m.warm_start_steps)
    path = Path(m.base).expanduser()
    if _HUB_ID.match(m.base) and not path.exists():
        return hub_model(m.base, "base")
    return path.resolve()


def build(data: dict[str, Any], source: str) -> Swarm:
    """Validate a swarm description, then load its dataset tasks (paths against the file's folder)
    and register them in this process."""
    from swarmrl.agents.tasks.dataset import DatasetError, register_data_tasks

    try:
        swarm = Swarm.model_validate(data)
    except ValidationError as exc:
        lines = "\n  ".join(error_lines(exc, Swarm))
        raise SwarmConfigError(f"invalid swarm description {source}:\n  {lines}") from None
    base = Path(source).parent if Path(source).is_file() else Path.cwd()
    swarm.tasks = {name: t.resolve_paths(base) if t.own else t for name, t in swarm.tasks.items()}
    try:
        register_data_tasks(swarm.tasks)
    except DatasetError as exc:
        raise SwarmConfigError(f"swarm description {source}: {exc}") from None
    return swarm


def load(path: Path) -> dict[str, Any]:
    """Parse a swarm TOML file (not yet validated: flags may still override it)."""
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SwarmConfigError(f"swarm config {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:  # duplicate tables land here, with their line
        raise SwarmConfigError(f"swarm config {path} is not valid TOML: {exc}") from None
