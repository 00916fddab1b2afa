"""`swarmrl up` refuses bad flags before starting anything."""

from __future__ import annotations

import pytest

from swarmrl.up import parse_args


def test_defaults_parse() -> None:
    _, swarm = parse_args([])
    assert list(swarm.tasks) == ["calculator"] and swarm.run.minutes == 15.0 and swarm.run.eval_samples >= 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--task", "calculator,nope"], "[tasks.nope]: unknown built-in task"),
        (
            ["--num-repeat", "1"],
            "models.policy.trainer.num_repeat: Input should be greater than or equal to 2",
        ),
        (["--eval-samples", "0"], "run.eval_samples: Input should be greater than or equal to 1"),
        (["--abort-rate", "1.5"], "run.abort_rate: Input should be less than 1"),
        (["--lr", "0"], "models.policy.trainer.lr: Input should be greater than 0"),
        (["--max-backlog", "-2"], "gateway.max_backlog: Input should be greater than or equal to -1"),
        (["--trainer-arg=--no-such-setting"], "--trainer-arg --no-such-setting"),
        (
            ["--trainer-arg=--kl-coef=-1"],
            "models.policy.trainer.kl_coef: Input should be greater than or equal to 0",
        ),
        (["--clients", "-1"], "tasks.calculator.clients: Input should be greater than or equal to 0"),
    ],
)
def test_bad_flags_exit_with_a_message(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--nats", "--nats-conf"])
def test_a_password_on_the_command_line_is_refused(flag: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args([flag, "nats://service:s3cret@127.0.0.1:4222"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "SWARMRL_NATS" in err and "s3cret" not in err


def test_services_and_clients_refuse_a_password_on_the_command_line_too(
    capsys: pytest.CaptureFixture,
) -> None:
    from swarmrl.agents.runner import main as runner_main
    from swarmrl.credentials import main as credentials_main
    from swarmrl.research.cli import main as research_main
    from swarmrl.services.merger.main import main as merger_main

    for main, argv in (
        (merger_main, []),
        (runner_main, []),
        (credentials_main, ["mint", "alice"]),
        (research_main, ["--topic", "lr"]),
    ):
        with pytest.raises(SystemExit) as exit_:
            main([*argv, "--nats=nats://agent:s3cret@127.0.0.1:4222"])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and "password on the command line" in err and "s3cret" not in err


def test_a_run_dir_that_holds_a_run_is_resumed_only_when_asked(
    tmp_path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "swarm.json").write_text(parse_args([])[1].model_dump_json())
    with pytest.raises(SystemExit):
        parse_args(["--run-dir", str(tmp_path)])
    assert f"--run-dir {tmp_path} holds a run already; give --resume {tmp_path}" in capsys.readouterr().err
    assert parse_args(["--resume", str(tmp_path)])[0].run_dir == tmp_path
    assert parse_args(["--run-dir", str(tmp_path / "new")])[0].run_dir == tmp_path / "new"


def test_a_resumed_run_keeps_its_own_tasks(tmp_path) -> None:
    _, swarm = parse_args(["--task", "guess_number", "--clients", "1", "--lr", "3e-4"])
    (tmp_path / "swarm.json").write_text(swarm.model_dump_json())
    _, resumed = parse_args(["--resume", str(tmp_path), "--minutes", "2"])
    assert list(resumed.tasks) == ["guess_number"] and resumed.tasks["guess_number"].clients == 1
    assert resumed.trainer("policy").lr == 3e-4 and resumed.run.minutes == 2
