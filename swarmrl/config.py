"""Config base for every service and command: a pydantic-settings class whose field docstrings are the
`--help` text. Values come from the command line (`--kebab-case`), then `SWARMRL_<FIELD>` env vars."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TypeVar
from urllib.parse import urlsplit

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


def password_on_command_line(argv: Sequence[str]) -> str | None:
    """Why `argv` must be refused, or None: a URL in it that carries a password would be readable
    by every user of the machine (`ps`, /proc). Credentials go by environment or file."""
    for arg in argv:
        value = arg.partition("=")[2] if arg.startswith("--") else arg
        for url in (urlsplit(part.strip()) for part in value.split(",") if "://" in part):
            if url.password:
                return (
                    f"a URL with a password on the command line ({url.scheme}://{url.username}:***@...) is "
                    "visible to every user of this machine; pass it in the environment (SWARMRL_NATS, "
                    "SWARMRL_AGENT_NATS) or a connect file (SWARMRL_CONNECT_FILE, `swarmrl credentials mint`) instead"
                )
    return None


def parse_config(cls: type[C], argv: Sequence[str] | None, prog: str) -> C:
    """Parse `argv` into `cls`; `--help` prints every field with its docstring. A password on the
    command line is refused (exit 2): set the URL with `SWARMRL_NATS` instead."""
    if reason := password_on_command_line(list(argv or [])):
        print(f"{prog}: error: {reason}", file=sys.stderr)
        raise SystemExit(2)
    cls.model_config["cli_prog_name"] = prog
    return CliApp.run(cls, cli_args=list(argv or []))
