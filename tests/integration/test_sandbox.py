"""The code sandbox against real processes, in every mode this machine has: bwrap, rlimit (with
`unshare` where it works) and bare rlimit (no namespaces: audit-hook guards only)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from swarmrl.services.actions import sandbox, sandbox_host
from swarmrl.services.actions.sandbox import PythonSandbox, SandboxLimits, detect_mode

REPO = Path(__file__).resolve().parents[2]
FAST = SandboxLimits(cpu_s=1, wall_s=30)
"""Tight CPU, loose wall clock: a loaded CI machine must not turn a CPU kill into a timeout."""
HAS_BWRAP = shutil.which("bwrap") is not None and detect_mode() == "bwrap"
NO_BWRAP = "bubblewrap is not installed or does not work here (Debian package bubblewrap)"
MODES = [
    pytest.param("bwrap", marks=pytest.mark.skipif(not HAS_BWRAP, reason=NO_BWRAP)),
    "rlimit",
    "rlimit-bare",
]


@pytest.fixture(params=MODES)
async def make(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Callable]:
    """Builds started sandboxes in the test's mode; closes them all afterwards."""
    mode = request.param
    if mode == "rlimit-bare":
        monkeypatch.setattr(sandbox, "launch_prefix", lambda mode, python: [])
    made: list[PythonSandbox] = []

    async def build(units: int = 1, **kwargs: object) -> PythonSandbox:
        sb = PythonSandbox(mode=mode.split("-")[0], limits=kwargs.pop("limits", FAST), **kwargs)  # type: ignore[arg-type]
        made.append(sb)
        await sb.start(units)
        return sb

    yield build
    for sb in made:
        await sb.close()


async def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110 (process state has no event to await)
            await asyncio.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def tree(roots: list[int]) -> set[int]:
    """`roots` and all their live descendants, from /proc (no psutil)."""
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    parents[int(name)] = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError):
                pass
    found = set(roots)
    while grown := {pid for pid, ppid in parents.items() if ppid in found and pid not in found}:
        found |= grown
    return {pid for pid in found if alive(pid)}


async def test_hello_exit_code_traceback_stdin(make: Callable) -> None:
    sb = await make()
    out = await sb.run("print('hello')")
    assert (out.status, out.result["stdout"], out.result["exit_code"]) == ("ok", "hello\n", 0)
    assert out.run_s > 0
    out = await sb.run("import sys\nprint('bye', file=sys.stderr)\nsys.exit(3)")
    assert (out.status, out.result["stderr"], out.result["exit_code"]) == ("ok", "bye\n", 3)
    out = await sb.run("def f():\n    return 1 / 0\nf()")
    assert out.status == "ok" and out.result["exit_code"] == 1
    assert 'File "<action>", line 2, in f' in out.result["stderr"]
    assert out.result["stderr"].endswith("ZeroDivisionError: division by zero\n")
    assert "sandbox" not in out.result["stderr"]  # our own frames are not in the traceback
    out = await sb.run("def (:")
    assert out.result["exit_code"] == 1 and "SyntaxError" in out.result["stderr"]
    out = await sb.run("import sys; print(sys.stdin.read()[::-1])", stdin="abc")
    assert out.result["stdout"] == "cba\n"
    assert sb.counts["ok"] == 5


async def test_bad_input_is_rejected(make: Callable) -> None:
    sb = await make()
    assert (await sb.run(b"print(1)")).status == "rejected"  # type: ignore[arg-type]
    assert (await sb.run("x" * (2 << 20))).status == "rejected"
    out = await sb.run("print(1)", limits=SandboxLimits(cpu_s=-1))
    assert out.status == "rejected" and "cpu_s" in out.error
    assert sb.counts["rejected"] == 3
    assert (await sb.run("print(1)")).status == "ok"


async def test_infinite_loop_is_killed_at_the_cpu_limit(make: Callable) -> None:
    sb = await make(limits=SandboxLimits(cpu_s=1, wall_s=60))
    out = await sb.run("while True:\n    pass")
    assert out.status == "killed" and out.error == "killed: CPU time limit of 1 s"
    assert out.result["signal"] == "SIGXCPU"  # sent by RLIMIT_CPU only: the CPU limit, not the wall
    assert sb.counts["killed_cpu"] == 1
    assert (await sb.run("print('next')")).result["stdout"] == "next\n"


async def test_sleep_times_out_at_the_wall_clock(make: Callable) -> None:
    sb = await make(limits=SandboxLimits(wall_s=1))
    out = await sb.run("import time\ntime.sleep(100)")
    assert out.status == "timeout" and out.error == "wall-clock limit of 1 s"
    assert out.run_s >= 1 and out.result["cpu_s"] < 1
    assert sb.counts["timeout"] == 1
    assert (await sb.run("print('next')")).status == "ok"


@pytest.mark.parametrize(
    "code",
    ["x = bytearray(1 << 30)", "chunks = []\nwhile True:\n    chunks.append(bytearray(10_000_000))"],
)
async def test_memory_bomb_is_killed_at_the_memory_limit(make: Callable, code: str) -> None:
    sb = await make()
    out = await sb.run(code)
    assert out.status == "killed" and out.error == "killed: memory limit of 256 MB"
    assert sb.counts["killed_memory"] == 1
    assert (await sb.run("print(len(bytearray(50_000_000)))")).result["stdout"] == "50000000\n"


async def test_fork_bomb_is_contained(make: Callable) -> None:
    sb = await make(2, limits=SandboxLimits(cpu_s=2, wall_s=2, nproc=16))
    out = await sb.run("import os\nwhile True:\n    os.fork()")
    assert out.status == "killed" and out.error == "killed: process limit of 16 processes"
    # A bomb that survives its failed forks runs into the wall clock; all of it is killed.
    out = await sb.run(
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    )
    assert out.status in ("timeout", "killed")
    host = await asyncio.create_subprocess_exec("true")
    assert await host.wait() == 0  # the host still forks
    assert not tree(sb.worker_pids()) - set(sb.worker_pids()) - _wrappers(sb)  # nothing left running
    outs = await asyncio.gather(*(sb.run(f"print({i})") for i in range(4)))
    assert [o.result["stdout"] for o in outs] == [f"{i}\n" for i in range(4)]


async def test_leftover_processes_are_killed_and_counted(make: Callable) -> None:
    sb = await make()
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(100)\nprint('parent done')"
    out = await sb.run(code)
    assert out.status == "ok" and out.result["stdout"] == "parent done\n"
    assert out.result["leftover_processes"] == 1 and sb.counts["leftover_processes"] == 1
    assert not tree(sb.worker_pids()) - _wrappers(sb)


def _wrappers(sb: PythonSandbox) -> set[int]:
    """The worker processes themselves: bwrap or unshare, and the zygote (not the code's)."""
    found = set()
    for pid in tree(sb.worker_pids()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        if os.path.basename(cmdline[0]) in (b"bwrap", b"unshare") or any(
            b"sandbox_zygote" in arg for arg in cmdline
        ):
            found.add(pid)
    return found


async def test_sockets_fail_inside(make: Callable) -> None:
    sb = await make()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        for host, p in (("1.1.1.1", 80), ("127.0.0.1", port)):
            code = f"import socket\nsocket.create_connection(({host!r}, {p}), timeout=3)\nprint('connected')"
            out = await sb.run(code)
            assert out.status == "ok" and out.result["exit_code"] == 1, out
            assert "connected" not in out.result["stdout"]
            assert "Error" in out.result["stderr"]  # OSError (no route) or PermissionError (guard)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing reached the host's listener
    finally:
        listener.close()


async def test_writes_outside_the_work_dir_fail(make: Callable) -> None:
    sb = await make()
    for target in (Path("/tmp") / f"outside-{uuid.uuid4().hex}", REPO / f"outside-{uuid.uuid4().hex}"):
        out = await sb.run(f"open({str(target)!r}, 'w').write('escaped')")
        assert out.result["exit_code"] == 1 and "Error" in out.result["stderr"], out
        assert not target.exists()
        out = await sb.run(f"import os\nos.mkdir({str(target)!r})")
        assert out.result["exit_code"] == 1 and not target.exists()
    out = await sb.run("open('mine.txt', 'w').write('x')\nimport os\nprint(os.listdir('.'))")
    assert out.status == "ok" and out.result["stdout"] == "['mine.txt']\n"
    out = await sb.run("import os\nprint(os.listdir('.'))")
    assert out.result["stdout"] == "[]\n"  # a fresh work dir per action


async def test_stdout_flood_is_truncated(make: Callable) -> None:
    sb = await make(limits=SandboxLimits(cpu_s=2, wall_s=2, output_bytes=1000))
    out = await sb.run("print('x' * 10_000_000)\nprint('done', file=__import__('sys').stderr)")
    assert out.status == "ok" and out.result["truncated"]
    assert out.result["stdout"] == "x" * 1000 and out.result["stderr"] == "done\n"
    out = await sb.run("import sys\nwhile True:\n    sys.stdout.write('y' * 4096)")
    assert out.status in ("timeout", "killed") and len(out.result["stdout"]) == 1000


async def test_many_actions_in_parallel_on_n_units(make: Callable) -> None:
    sb = await make(3)
    outs = await asyncio.gather(
        *(sb.run(f"import time\ntime.sleep(0.05)\nprint({i} * {i})") for i in range(24))
    )
    assert [o.result["stdout"] for o in outs] == [f"{i * i}\n" for i in range(24)]
    assert sb.counts["ok"] == 24 and sb.counts["worker_started"] == 3


async def test_resize_up_and_down(make: Callable) -> None:
    sb = await make(1)
    await sb.resize(3)
    assert sb.units == 3 and len(sb.worker_pids()) == 3
    first = sb.worker_pids()
    slow = asyncio.create_task(sb.run("import time\ntime.sleep(0.5)\nprint('busy')"))
    await wait_until(lambda: len(sb._idle) == 2)
    await sb.resize(1)  # two idle workers stop now, the busy one keeps its action
    assert (await slow).result["stdout"] == "busy\n"
    assert sb.units == 1
    await wait_until(lambda: sum(alive(p) for p in first) == 1)
    assert (await sb.run("print('still')")).result["stdout"] == "still\n"


async def test_close_leaves_no_processes(make: Callable) -> None:
    sb = await make(2)
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(100)\ntime.sleep(100)"
    running = asyncio.create_task(sb.run(code, limits=SandboxLimits(wall_s=60)))
    await wait_until(lambda: len(tree(sb.worker_pids())) >= len(sb.worker_pids()) + 2)
    everything = tree(sb.worker_pids())
    await sb.close()
    assert (await running).status == "error"
    await wait_until(lambda: not any(alive(p) for p in everything), timeout=5)
    assert (await sb.run("print(1)")).status == "error"


async def test_swarmrl_imports_inside(make: Callable) -> None:
    sb = await make(preload=("swarmrl.agents.tasks.arith",))
    code = "from swarmrl.agents.tasks.arith import safe_eval, format_number\nprint(format_number(safe_eval('2+3*4')))"
    out = await sb.run(code)
    assert out.result["stdout"] == "14\n", out
    if sb.isolation["imports"] != "any":
        pytest.skip("the dropped uid cannot reach the interpreter's directories: preloaded modules only")
    out = await sb.run("import fractions, decimal\nprint(fractions.Fraction(1, 3))")
    assert out.result["stdout"] == "1/3\n", out


async def test_a_killed_worker_is_replaced(make: Callable) -> None:
    sb = await make(1, limits=SandboxLimits(wall_s=30))
    before = sb.worker_pids()
    os.killpg(before[0], signal.SIGKILL)
    await wait_until(lambda: sb.counts["worker_replaced"] == 1 and sb.units == 1 and sb._idle)
    assert sb.worker_pids() != before and sb.counts["worker_died"] == 1
    assert (await sb.run("print('alive')")).result["stdout"] == "alive\n"
    # Killed while it runs an action: that action is an error, the pool goes on.
    running = asyncio.create_task(sb.run("import time\ntime.sleep(30)"))
    await wait_until(lambda: not sb._idle)
    os.killpg(sb.worker_pids()[0], signal.SIGKILL)
    out = await running
    assert out.status == "error" and "worker died" in out.error
    await wait_until(lambda: sb.counts["worker_replaced"] == 2 and bool(sb._idle))
    assert (await sb.run("print('again')")).result["stdout"] == "again\n"


async def test_rlimit_guard_refuses_new_programs(make: Callable) -> None:
    sb = await make(preload=("subprocess",))
    out = await sb.run("import subprocess\nprint(subprocess.run(['echo', 'hi'], capture_output=True).stdout)")
    if sb.mode == "bwrap":
        assert out.result["stdout"] == "b'hi\\n'\n"
    else:
        assert out.result["exit_code"] == 1 and "subprocess.Popen is not allowed" in out.result["stderr"]


@pytest.mark.skipif(not HAS_BWRAP, reason=NO_BWRAP)
async def test_bwrap_work_dir_space_is_bounded() -> None:
    sb = PythonSandbox(mode="bwrap", limits=SandboxLimits(fsize_mb=16, wall_s=30))
    await sb.start(1)
    try:
        code = "block = b'x' * (8 << 20)\nfor i in range(100):\n    open(f'f{i}', 'wb').write(block)"
        out = await sb.run(code)  # 800 MB in 8 MB files: each under RLIMIT_FSIZE, together over the tmpfs
        assert out.result["exit_code"] == 1 and "No space left on device" in out.result["stderr"], out
        assert (await sb.run("open('again', 'wb').write(b'x' * (8 << 20))")).result["exit_code"] == 0
    finally:
        await sb.close()


@pytest.mark.skipif(not HAS_BWRAP, reason=NO_BWRAP)
async def test_bwrap_root_is_read_only_and_home_hidden() -> None:
    sb = PythonSandbox(mode="bwrap", limits=FAST)
    await sb.start(1)
    try:
        out = await sb.run(
            "import os\ntry:\n    os.mkdir('/opt/x')\nexcept OSError as e:\n    print(e.errno)"
        )
        assert out.result["stdout"] in ("30\n", "13\n")  # EROFS, or EACCES as the dropped uid
        if os.geteuid() == 0 and not os.stat("/root").st_mode & 0o001:
            # A 0700 /root is an empty tmpfs inside, but for the interpreter's paths bound back.
            out = await sb.run("import json, os\nprint(json.dumps(os.listdir('/root')))")
            kept = {
                p.split("/")[2]
                for p in sandbox_host.interpreter_paths(sys.executable)
                if p.startswith("/root/")
            }
            assert set(json.loads(out.result["stdout"])) == kept
        assert sb.isolation["network"] == "network namespace" and sb.isolation["pid_namespace"]
    finally:
        await sb.close()


def test_detect_mode_and_limits() -> None:
    assert detect_mode() in ("bwrap", "rlimit")
    with pytest.raises(ValueError, match="sandbox mode"):
        PythonSandbox(mode="docker")
    with pytest.raises(ValueError, match="mem_mb"):
        SandboxLimits(mem_mb=0).check()
