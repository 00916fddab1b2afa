"""`swarmrl up` refuses bad flags before starting anything."""

from __future__ import annotations

import pytest

from swarmrl.up import parse_args


def test_defaults_parse() -> None:
    args = parse_args([])
    assert args.task == "calculator" and args.minutes == 15.0 and args.eval_samples >= 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--task", "calculator,nope"], "unknown task"),
        (["--num-repeat", "1"], "--num-repeat must be >= 2"),
        (["--eval-samples", "0"], "--eval-samples must be >= 1"),
        (["--abort-rate", "1.5"], "--abort-rate must be in"),
        (["--lr", "0"], "--lr must be > 0"),
        (["--max-backlog", "-2"], "--max-backlog must be >= -1"),
    ],
)
def test_bad_flags_exit_with_a_message(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err
