"""Config base for every service and command: a pydantic-settings class whose field docstrings are the
`--help` text. Values come from the command line (`--kebab-case`), then `SWARMRL_<FIELD>` env vars."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from pydantic_settings import BaseSettings, CliApp, SettingsConfigDict

C = TypeVar("C", bound=BaseSettings)


class ServiceConfig(BaseSettings):
    model_config = SettingsConfigDict(
        use_attribute_docstrings=True,
        cli_kebab_case=True,
        cli_implicit_flags=True,
        env_prefix="SWARMRL_",
        extra="forbid",
    )

    nats: str = "nats://127.0.0.1:4222"
    """NATS URL(s), comma-separated, with service credentials (nats://service:PASSWORD@host:port)."""
    log_level: str = "INFO"
    """Logging level (DEBUG, INFO, WARNING)."""


def parse_config(cls: type[C], argv: Sequence[str] | None, prog: str) -> C:
    """Parse `argv` into `cls`; `--help` prints every field with its docstring."""
    cls.model_config["cli_prog_name"] = prog
    return CliApp.run(cls, cli_args=list(argv or []))
