"""What `up` hands to clients: an owner-only identity file each, and each task's client command line."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from swarmrl.infra.credentials import AgentCredential, AgentRegistry
from swarmrl.launch import OUTSIDE, AgentIds, client_argv
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


def test_each_client_gets_its_own_owner_only_identity_file(tmp_path: Path) -> None:
    registry = AgentRegistry(tmp_path / "conf")
    ids = AgentIds(registry, "nats://service:pw123@127.0.0.1:4222,nats://127.0.0.1:4223", team(), tmp_path)
    (tmp_path / "connect.json").write_text("{}")
    (tmp_path / "connect.json").chmod(0o644)  # an old file must not keep a readable mode
    files = ids.mint([OUTSIDE, "client-team_calculator-0", "client-team_calculator-1"])
    assert files[OUTSIDE] == tmp_path / "connect.json"
    creds = {name: AgentCredential.read(path) for name, path in files.items()}
    for path in files.values():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert "pw123" not in path.read_text()  # the service password never reaches an agent
    assert [c.name for c in creds.values()] == ["outside", "team-calculator-0", "team-calculator-1"]
    assert len({c.seed for c in creds.values()}) == 3  # one key each
    info = json.loads(files[OUTSIDE].read_text())
    assert info["nats_url"] == "nats://127.0.0.1:4222,nats://127.0.0.1:4223"
    assert info["inbox_prefix"] == "_INBOX.outside" and info["models"] == ["caller", "reporter"]
    assert info["tasks"]["team_calculator"] == {
        "roles": {"caller": "caller", "reporter": "reporter"},
        "num_repeat": 8,
    }
    # the server config lists exactly these public keys, each limited to its own subjects
    assert registry.load() == {c.name: c.public_key for c in creds.values()}
    users = (tmp_path / "conf" / "agents.conf").read_text()
    assert "swarm.ep.team-calculator-1.*.reward" in users and "_INBOX.outside.>" in users
    assert all(c.seed not in users for c in creds.values())  # public keys only
    ids.revoke(["client-team_calculator-0"])
    assert set(registry.load()) == {"outside", "team-calculator-1"}


def test_client_command_lines_carry_roles_and_never_credentials() -> None:
    swarm = team()
    argv = client_argv(swarm, "team_calculator")
    assert argv[:2] == ["-m", "swarmrl.agents.runner"]
    assert "--role" in argv and "caller=caller" in argv and "reporter=reporter" in argv
    assert not any("nats://" in a for a in argv)
    assert client_argv(swarm, "calculator") == ["node", "agent.mjs"]


def test_reply_limits_come_from_the_task_then_the_run_then_the_tasks_own_need() -> None:
    swarm = build(
        {"models": {"policy": {}}, "tasks": {"calculator": {}, "guess_number": {"max_tokens": 12}}}, "t"
    )
    assert (swarm.max_tokens("calculator"), swarm.max_tokens("guess_number")) == (None, 12)
    assert "--max-tokens" not in client_argv(swarm, "calculator")  # the runner takes TaskSpec.max_tokens
    argv = client_argv(swarm, "guess_number")
    assert argv[argv.index("--max-tokens") + 1] == "12"
    run_wide = build({"run": {"max_tokens": 30}, "models": {"policy": {}}, "tasks": {"calculator": {}}}, "t")
    assert run_wide.max_tokens("calculator") == 30
    from swarmrl.agents.tasks import get_task

    assert get_task("calculator").max_tokens == 48
