"""Config bases for every service and command.

A service declares what a swarm description may set as a `Settings` model (plain pydantic: it reads
nothing but the description), and its process configuration as a `ServiceConfig` extending it with
placement. That is a pydantic-settings class whose field docstrings are the `--help` text; values
come from the command line, then `--config` (the resolved file `swarmrl up` writes per process),
then `SWARMRL_<FIELD>` env vars, then the field's one declared default."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from types import UnionType
from typing import Any, ClassVar, TypeVar, Union, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import BaseModel, ValidationError
from pydantic_settings import BaseSettings, CliApp, SettingsConfigDict

C = TypeVar("C", bound=BaseSettings)


class SwarmConfigError(ValueError):
    """The swarm description is invalid; the message names the offending entry."""


class Strict(BaseModel):
    """A table of the swarm description: unknown keys are errors, field docstrings are the help."""

    # A settings dict, so that a service's config class may extend this and ServiceConfig both.
    model_config: ClassVar[SettingsConfigDict] = SettingsConfigDict(
        extra="forbid", use_attribute_docstrings=True
    )


class Settings(Strict):
    """The settings of a service that a swarm description may set (its `[<service>]` table)."""

    log_level: str = "INFO"
    """Logging level (DEBUG, INFO, WARNING)."""


class ServiceConfig(BaseSettings):
    """A service process's whole configuration; each service's class extends its `Settings` too."""

    model_config = SettingsConfigDict(
        use_attribute_docstrings=True,
        cli_kebab_case=True,
        cli_implicit_flags=True,
        env_prefix="SWARMRL_",
        extra="forbid",
    )

    nats: str = "nats://127.0.0.1:4222"
    """NATS URL(s), comma-separated, with service credentials (nats://service:PASSWORD@host:port)."""
    config: Path | None = None
    """Configuration file: this process's resolved configuration (JSON, as `swarmrl up` writes it),
    or a swarm description (TOML; `--model NAME` for an engine or trainer), which configures this
    service as `swarmrl up` would. Flags override it."""
    print_config: bool = False
    """Print the resolved configuration as JSON and exit."""


UNFILED = frozenset({"config", "print_config", "nats", "secret"})
"""Fields never written to a configuration file: credentials (they come by environment) and the
file options."""


def config_dict(cfg: BaseModel) -> dict[str, Any]:
    """`cfg` as JSON-ready values, without the `UNFILED` fields."""
    return cfg.model_dump(mode="json", exclude=set(UNFILED) & set(type(cfg).model_fields))


def write_config_file(path: Path, service: str, cfg: BaseModel) -> Path:
    """Write `service`'s resolved configuration `cfg` to `path` (what `--config` reads back)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"service": service, "config": config_dict(cfg)}, indent=2) + "\n")
    return path


def read_config_file(path: Path, service: str) -> dict[str, Any]:
    """The values of a file `write_config_file` wrote for `service`; a clear exit otherwise."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise SystemExit(f"--config {path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise SystemExit(f"--config {path}: not a resolved configuration (JSON): {exc}") from None
    found = data.get("service") if isinstance(data, dict) else None
    if found != service or not isinstance(data.get("config"), dict):
        raise SystemExit(f"--config {path}: not a resolved configuration of {service} (service: {found!r})")
    return dict(data["config"])


def password_on_command_line(argv: Sequence[str] | None) -> str | None:
    """Why `argv` (None: `sys.argv[1:]`) must be refused, or None: a password in a URL on it is readable
    by every user."""
    for arg in sys.argv[1:] if argv is None else argv:
        value = arg.partition("=")[2] if arg.startswith("--") else arg
        for url in (urlsplit(part.strip()) for part in value.split(",") if "://" in part):
            if url.password:
                return (
                    f"a URL with a password on the command line ({url.scheme}://{url.username}:***@...) is "
                    "visible to every user of this machine; pass it in the environment (SWARMRL_NATS, "
                    "SWARMRL_AGENT_NATS) or a connect file (SWARMRL_CONNECT_FILE, `swarmrl credentials mint`) instead"
                )
    return None


def plain_servers(url: str) -> list[str]:
    """`scheme://host:port` of each server of a (comma-separated) NATS URL, credentials dropped: for
    messages, and for clients that log in with their own. No port: NATS's 4222, as nats-py reads it."""
    parts = [urlsplit(u.strip()) for u in url.split(",")]
    return [f"{p.scheme}://{p.hostname}:{p.port or 4222}" for p in parts if p.hostname]


def parse_config(cls: type[C], argv: Sequence[str] | None, prog: str) -> C:
    """Parse `argv` into `cls` over the values of `--config FILE` (of the service `prog` names
    last); `--print-config` prints the result and exits, a password on the command line exits 2."""
    argv = list(argv or [])
    if reason := password_on_command_line(argv):
        print(f"{prog}: error: {reason}", file=sys.stderr)
        raise SystemExit(2)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", type=Path)
    known, _ = pre.parse_known_args(argv)
    values = read_config_file(known.config, prog.rsplit(" ", 1)[-1]) if known.config else {}
    cls.model_config["cli_prog_name"] = prog
    cfg = CliApp.run(cls, cli_args=argv, **values)
    if getattr(cfg, "print_config", False):
        print(json.dumps(config_dict(cfg), indent=2))
        raise SystemExit(0)
    return cfg


def default_of(cls: type[BaseModel], field: str) -> Any:
    """The one declared default of `cls.field` (for a command line that does not parse `cls`)."""
    return cls.model_fields[field].get_default(call_default_factory=True)


def table_at(kind: Any, loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The table (a model class) at `loc` inside model `kind`, through dicts, lists and optionals
    (`models.policy.trainer` of `Swarm`: `TrainerSettings`), or None."""
    for part in [*loc, None]:
        while get_origin(kind) in (Union, UnionType):  # `X | None`: X
            kind = next(a for a in get_args(kind) if a is not type(None))
        if part is None:
            break
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            field = kind.model_fields.get(str(part))
            kind = None if field is None else field.annotation
        else:  # a dict's value, a list's item
            kind = get_args(kind)[-1] if get_args(kind) else None
    return kind if isinstance(kind, type) and issubclass(kind, BaseModel) else None


def error_lines(exc: ValidationError, model: type[BaseModel]) -> list[str]:
    """The errors of validating `model`, one `where: what` each; an unknown key with its near misses,
    or that placement sets it."""
    out = []
    for e in exc.errors():
        where, msg = ".".join(map(str, e["loc"])), e["msg"].removeprefix("Value error, ")
        table = table_at(model, e["loc"][:-1]) if e["type"] == "extra_forbidden" else None
        if table is not None:
            key, keys = str(e["loc"][-1]), list(table.model_fields)
            near = difflib.get_close_matches(key, keys, n=3)
            if issubclass(table, Settings) and any(key in sub.model_fields for sub in table.__subclasses__()):
                msg = "set by `swarmrl up` where it places the process, not by a description"
            elif near:
                msg += f"; did you mean {' or '.join(map(repr, near))}?"
            else:
                msg += f"; known: {', '.join(keys)}"
        out.append(f"{where}: {msg}" if where else msg)
    return out
