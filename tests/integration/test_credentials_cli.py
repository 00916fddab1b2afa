"""`swarmrl credentials` against a running nats-server: mint, list and revoke reach it live."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import nats
import pytest

from swarmrl.credentials import main
from swarmrl.infra.credentials import AgentCredential
from swarmrl.infra.nats_server import NatsServer


async def test_mint_list_and_revoke_a_client_while_the_server_runs(
    nats_server: NatsServer, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    conf = ["--conf-dir", str(nats_server.conf_dir)]
    out = tmp_path / "bob.json"
    assert main(["mint", "bob", *conf, "--nats", nats_server.plain_url, "--out", str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    cred = AgentCredential.read(out)
    nc = await nats.connect(**cred.nats_options(), allow_reconnect=False)  # accepted: the server reloaded
    assert main(["list", *conf]) == 0
    listed = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert listed["bob"] == cred.public_key and "agent" in listed
    assert main(["revoke", "bob", *conf]) == 0
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(**cred.nats_options(), allow_reconnect=False)
    assert nc.is_closed or not nc.is_connected
    assert main(["revoke", "bob", *conf]) == 1  # gone already: said so, exit 1


def test_bad_names_and_missing_runs_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["mint", "has_underscore", "--conf-dir", str(tmp_path), "--nats", "nats://127.0.0.1:1"])
    assert exit_.value.code == 2 and "client name" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="no embedded NATS server"):
        main(["list", "--run-dir", str(tmp_path)])
