"""The run report's excerpt of a failed server's log: its first error, of the process that raised it."""

from tests.conftest import first_error

LOG = """\
(APIServer pid=7) INFO 11-27 03:47:00 [api_server.py:1] Started
(EngineCore pid=9) ERROR 11-27 03:48:06 [core.py:1233] EngineCore encountered a fatal error.
(EngineCore pid=9) ERROR 11-27 03:48:06 [core.py:1233] Traceback (most recent call last):
(APIServer pid=7) INFO 11-27 03:48:06 [api_server.py:2] POST /inference/v1/generate 500
(EngineCore pid=9) ERROR 11-27 03:48:06 [core.py:1233]     out = self.step()
(EngineCore pid=9) ERROR 11-27 03:48:06 [core.py:1233]           ^^^^^^^^^^^
(EngineCore pid=9) ERROR 11-27 03:48:06 [core.py:1233] IndexError: index 5 is out of bounds
(APIServer pid=7) ERROR 11-27 03:48:06 [vllm_error.py:54] EngineDeadError: EngineCore encountered an issue.
""".splitlines()


def test_the_first_error_is_the_raising_process_own_lines_without_carets() -> None:
    got = first_error(LOG)
    assert [line.split("] ")[-1] for line in got] == [
        "EngineCore encountered a fatal error.",
        "Traceback (most recent call last):",
        "    out = self.step()",
        "IndexError: index 5 is out of bounds",
    ]
    assert first_error(LOG, keep=1)[0].endswith("IndexError: index 5 is out of bounds")
    assert first_error(["all well"]) == []
