"""What `up` hands to clients: the owner-only connect file, and each task's client command line."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from swarmrl.launch import agent_url_from_file, client_argv, write_connect_file
from swarmrl.swarm import build


def team():
    return build(
        {
            "models": {"caller": {}, "reporter": {"base": "tiny-llama"}},
            "tasks": {
                "team_calculator": {"roles": {"caller": "caller", "reporter": "reporter"}},
                "calculator": {"roles": {"agent": "caller"}, "command": ["node", "agent.mjs"], "clients": 0},
            },
        },
        "t",
    )


def test_the_connect_file_is_owner_only_and_gives_back_the_agent_url(tmp_path: Path) -> None:
    (tmp_path / "connect.json").write_text("{}")
    (tmp_path / "connect.json").chmod(0o644)  # an old file must not keep a readable mode
    path = write_connect_file(
        tmp_path, "nats://agent:pw123@127.0.0.1:4222,nats://agent:pw123@127.0.0.1:4223", team()
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    info = json.loads(path.read_text())
    assert (
        info["nats_url"] == "nats://127.0.0.1:4222,nats://127.0.0.1:4223" and "pw123" not in info["nats_url"]
    )
    assert (info["user"], info["password"], info["models"]) == ("agent", "pw123", ["caller", "reporter"])
    assert info["tasks"]["team_calculator"] == {
        "roles": {"caller": "caller", "reporter": "reporter"},
        "num_repeat": 8,
    }
    assert agent_url_from_file(path) == "nats://agent:pw123@127.0.0.1:4222,nats://agent:pw123@127.0.0.1:4223"


def test_client_command_lines_carry_roles_and_never_credentials() -> None:
    swarm = team()
    argv = client_argv(swarm, "team_calculator")
    assert argv[:2] == ["-m", "swarmrl.agents.runner"]
    assert "--role" in argv and "caller=caller" in argv and "reporter=reporter" in argv
    assert not any("nats://" in a for a in argv)
    assert client_argv(swarm, "calculator") == ["node", "agent.mjs"]
