"""The engine over HTTP: the SGLang-shaped API via httpx, `EngineClient`, the KV weight watcher against
a real nats-server, the whole service, and (GPU only) the same client against a real SGLang server."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from swarmrl.infra.nats_server import NatsServer, free_port
from swarmrl.schemas import ModelVersion, encode
from swarmrl.schemas import subjects as S
from swarmrl.services.common import bus
from swarmrl.services.common.http import BackgroundServer
from swarmrl.services.engine.client import EngineClient, EngineError
from swarmrl.services.engine.config import EngineConfig
from swarmrl.services.engine.engine_core import EngineCore
from swarmrl.services.engine.server import create_app
from swarmrl.services.engine.service import EngineService
from swarmrl.services.engine.weights import WeightWatcher
from tests.conftest import wait_for
from tests.support.localstack import embedded_engine
from tests.unit.engine.helpers import save_perturbed

MODEL = "tiny"
GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}


@pytest.fixture(scope="module")
def perturbed_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_perturbed(tiny_model_dir, tmp_path_factory.mktemp("engine-perturbed"))


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[tuple[EngineCore, str]]:
    """An embedded engine on a random port, shared by the tests that do not change its weights."""
    with embedded_engine(tiny_model_dir, max_batch=8) as served:
        yield served


@pytest.fixture
def fresh(tiny_model_dir: Path) -> Iterator[str]:
    """A private engine + server for tests that reload weights."""
    core = EngineCore(tiny_model_dir, weight_version="0")
    server = BackgroundServer(create_app(core)).start()
    yield server.url
    server.stop()
    core.close()


async def test_generate_answers_like_sglang(served: tuple[EngineCore, str]) -> None:
    core, url = served
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        body = {"input_ids": [5, 6, 7], "sampling_params": GREEDY, "return_logprob": True}
        one = (await http.post("/generate", json=body)).json()
        assert set(one) >= {"text", "output_ids", "meta_info"}
        meta = one["meta_info"]
        assert meta["finish_reason"] == {"type": "length", "length": 6}
        assert (meta["prompt_tokens"], meta["completion_tokens"], meta["weight_version"]) == (3, 6, "0")
        assert [entry[1] for entry in meta["output_token_logprobs"]] == one["output_ids"]
        assert all(entry[0] <= 0 and entry[2] is None for entry in meta["output_token_logprobs"])
        batch = {"input_ids": [[5, 6, 7], [8]], "sampling_params": [GREEDY, {**GREEDY, "max_new_tokens": 2}]}
        two = (await http.post("/generate", json=batch)).json()
        assert isinstance(two, list) and [len(x["output_ids"]) for x in two] == [6, 2]
        assert two[0]["output_ids"] == one["output_ids"]  # greedy, same prompt
        assert "output_token_logprobs" not in two[0]["meta_info"]  # return_logprob defaults to false
        text = (await http.post("/generate", json={"text": "hello", "sampling_params": GREEDY})).json()
        assert text["meta_info"]["prompt_tokens"] == len(core.encode("hello"))


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"input_ids": []}, "input_ids must be a non-empty list"),
        ({"input_ids": [1, 10**6]}, "outside the vocabulary"),
        ({"input_ids": [[1, 2], []]}, "prompt 1: input_ids is empty"),
        ({"input_ids": [1], "sampling_params": {"top_p": 2}}, "top_p must be in (0, 1]"),
        ({"input_ids": [1], "sampling_params": {"best_of": 2}}, "unknown sampling params ['best_of']"),
        ({"input_ids": [[1], [2]], "stream": True}, "stream=true takes one prompt, got a batch of 2"),
        ({"input_ids": [1], "stream": "yes"}, "stream must be true or false"),
        ({"input_ids": [1], "image_data": "x"}, "unsupported /generate fields ['image_data']"),
        ({"sampling_params": {}}, "exactly one of `input_ids` or `text`"),
        ({"input_ids": [1] * 5000}, "context length is 2048"),
    ],
)
async def test_invalid_requests_get_400_with_a_reason(
    served: tuple[EngineCore, str], body: dict, needle: str
) -> None:
    async with httpx.AsyncClient(base_url=served[1], timeout=60) as http:
        resp = await http.post("/generate", json=body)
    assert resp.status_code == 400
    assert needle in resp.json()["error"]["message"]


async def test_health_model_info_and_flush(served: tuple[EngineCore, str], tiny_model_dir: Path) -> None:
    async with EngineClient(served[1]) as client:
        await client.wait_ready(timeout=10)
        assert await client.health() and await client.health_generate()
        info = await client.model_info()
        assert info["model_path"] == str(tiny_model_dir) and info["is_generation"] is True
        assert info["tokenizer_path"] == str(tiny_model_dir) and info["weight_version"] == "0"
        await client.flush_cache()


async def test_cached_tokens_are_reported_and_flushed(served: tuple[EngineCore, str]) -> None:
    """SGLang's `meta_info.cached_tokens`: the prompt tokens served from the prefix cache."""
    prompt = list(range(3, 50))
    async with httpx.AsyncClient(base_url=served[1], timeout=60) as http:
        await http.post("/flush_cache")
        body = {"input_ids": prompt, "sampling_params": GREEDY}
        first = (await http.post("/generate", json=body)).json()
        again = (await http.post("/generate", json=body)).json()
        assert first["meta_info"]["cached_tokens"] == 0
        assert again["meta_info"]["cached_tokens"] == len(prompt) - 1
        assert again["output_ids"] == first["output_ids"]
        assert (await http.post("/flush_cache")).status_code == 200
        third = (await http.post("/generate", json=body)).json()
        assert third["meta_info"]["cached_tokens"] == 0
        assert (await http.get("/engine_stats")).json()["prefix_cache"]["hit_tokens"] >= len(prompt) - 1


async def test_client_generates_and_reloads_weights(fresh: str, perturbed_dir: Path) -> None:
    async with EngineClient(fresh) as client:
        before = await client.generate([5, 6, 7], GREEDY)
        assert before.finish_reason == "length" and before.weight_version == 0
        assert len(before.output_ids) == len(before.output_logprobs) == 6 and before.prompt_tokens == 3
        batch = await client.generate_batch([[5, 6, 7], [9, 9]], GREEDY)
        assert batch[0].output_ids == before.output_ids and len(batch) == 2
        stopped = await client.generate([5, 6, 7], {**GREEDY, "stop_token_ids": [before.output_ids[0]]})
        assert (stopped.finish_reason, stopped.matched, stopped.output_ids) == (
            "stop",
            before.output_ids[0],
            before.output_ids[:1],
        )
        await client.update_weights_from_disk(str(perturbed_dir), 7)
        after = await client.generate([5, 6, 7], GREEDY)
        assert after.weight_version == 7 and after.output_ids != before.output_ids
        assert (await client.model_info())["model_path"] == str(perturbed_dir)
        with pytest.raises(EngineError) as err:
            await client.update_weights_from_disk("/nonexistent/ckpt", 8)
        assert err.value.status == 400 and "/nonexistent/ckpt" in err.value.message
        assert (await client.generate([5, 6, 7], GREEDY)).weight_version == 7


async def test_client_errors_are_clear() -> None:
    async with EngineClient(f"http://127.0.0.1:{free_port()}", retries=2) as client:
        assert not await client.health()
        with pytest.raises(EngineError, match="unreachable for 2 attempts"):
            await client.generate([1], GREEDY)
        with pytest.raises(TimeoutError, match="not healthy after 0.3s"):
            await client.wait_ready(timeout=0.3, interval=0.1)


async def test_weight_watcher_follows_the_kv_bucket(
    swarm_nats: NatsServer, fresh: str, perturbed_dir: Path
) -> None:
    nc = await bus.connect(swarm_nats.service_url, "test")
    js = nc.jetstream()
    kv = await bus.models_kv(js)
    await kv.put(MODEL, encode(ModelVersion(version=3, path=str(perturbed_dir))))  # there before the watcher
    stop = asyncio.Event()
    async with EngineClient(fresh) as client:
        watcher = WeightWatcher(nc, client, MODEL, retry_s=0.1)
        task = asyncio.create_task(watcher.run(stop))
        try:
            await wait_for(lambda: watcher.applied == 3, what="the initial KV version applied")
            assert (await client.generate([5, 6, 7], GREEDY)).weight_version == 3
            await kv.put(MODEL, b"\x93not a ModelVersion")
            await kv.put(MODEL, encode(ModelVersion(version=2, path=str(perturbed_dir))))  # stale: skipped
            await kv.put(MODEL, encode(ModelVersion(version=4, path="/nonexistent/ckpt")))  # refused, retried
            await wait_for(lambda: watcher.counts["reload_error"] >= 2, what="retries of a bad checkpoint")
            await kv.put(MODEL, encode(ModelVersion(version=5, path=str(perturbed_dir))))  # replaces v4
            await wait_for(lambda: watcher.applied == 5, what="version 5 applied")
            assert watcher.counts["bad_value"] == 1 and watcher.counts["stale"] == 1
            assert (await client.model_info())["weight_version"] == "5"
            dlq = await js.pull_subscribe(S.dlq_subject("engine"), stream=S.DLQ_STREAM)
            [dead] = await dlq.fetch(1, timeout=5)
            assert dead.data == b"\x93not a ModelVersion" and dead.headers[bus.REASON_HEADER].startswith(
                "malformed"
            )
        finally:
            stop.set()
            await task
            await nc.close()


async def test_engine_service_serves_and_reloads(
    swarm_nats: NatsServer, tiny_model_dir: Path, perturbed_dir: Path
) -> None:
    cfg = EngineConfig(
        nats=swarm_nats.service_url, model=MODEL, model_path=str(tiny_model_dir), port=free_port()
    )
    service = EngineService(cfg)
    await service.start()
    try:
        nc = await bus.connect(swarm_nats.service_url, "test")
        kv = await bus.models_kv(nc.jetstream())
        await kv.put(MODEL, encode(ModelVersion(version=1, path=str(perturbed_dir))))
        async with EngineClient(service.url) as client:
            await wait_for(lambda: _version(client), what="the service to reload version 1")
            assert (await client.generate([5, 6], GREEDY)).weight_version == 1
        await nc.close()
    finally:
        await service.stop()


async def _version(client: EngineClient) -> bool:
    return (await client.model_info())["weight_version"] == "1"


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.slow
def test_serve_engine_exits_cleanly_on_sigterm(tiny_model_dir: Path) -> None:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "swarmrl.cli",
        "serve",
        "engine",
        "--nats",
        "",
        "--model-path",
        str(tiny_model_dir),
    ]
    proc = subprocess.Popen([*cmd, "--port", str(port)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not _healthy(port):
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "engine did not become healthy in 120s"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_engine_stops_cleanly_after_nats_died(
    tiny_model_dir: Path, nats_server: NatsServer, tmp_path: Path
) -> None:
    """A SIGKILLed broker must not keep the engine from stopping: closing a connection whose server is
    gone raised from `close()`, and a start still connecting ignored SIGTERM, so the engine (and a
    launched SGLang or vLLM server, in a session of its own) outlived its swarm."""
    port = free_port()
    env = {**os.environ, "SWARMRL_NATS": nats_server.service_url}
    cmd = [sys.executable, "-m", "swarmrl.cli", "serve", "engine", "--model-path", str(tiny_model_dir)]
    log = tmp_path / "engine.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*cmd, "--port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not _healthy(port):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        assert nats_server.proc is not None
        nats_server.proc.kill()
        nats_server.proc.wait()
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            code = None
        text = "\n".join(
            x for x in log.read_text(errors="replace").splitlines() if "Connect call failed" not in x
        )
        # the reconnect warnings (one each 0.5 s) would fill the message: show the other lines, which
        # say which stage of the engine held the signal
        quiet = "\n".join(x for x in text.splitlines() if "nats error" not in x)
        assert code == 0, quiet[-3000:]
        assert "Traceback" not in text, text[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.gpu
@pytest.mark.timeout(1200)
async def test_sglang_backend_speaks_the_same_api(tmp_path: Path) -> None:
    """Launch a real SGLang server with $SWARMRL_GPU_MODEL and drive it with the same client code."""
    model = os.environ.get("SWARMRL_GPU_MODEL")
    if not model:
        pytest.skip("set SWARMRL_GPU_MODEL to a small HF model directory to run the SGLang backend test")
    from swarmrl.services.engine.sglang_backend import SGLangServer

    server = SGLangServer(model, port=free_port(), log_path=tmp_path / "sglang.log")
    await asyncio.to_thread(server.start, 900)
    try:
        async with EngineClient(server.url) as client:
            greedy = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
            out = await client.generate([1, 2, 3, 4], greedy)
            assert len(out.output_ids) == len(out.output_logprobs) == 8 and out.finish_reason == "length"
            streamed = [r async for r in client.generate_stream([1, 2, 3, 4], greedy)]
            assert len(streamed) > 1 and not streamed[0].finished and streamed[-1].finished
            assert (streamed[-1].output_ids, streamed[-1].finish_reason) == (out.output_ids, "length")
            assert streamed[-1].output_logprobs == pytest.approx(out.output_logprobs, abs=1e-3)
            await client.update_weights_from_disk(model, 1)
            again = await client.generate([1, 2, 3, 4], greedy)
            assert again.weight_version == 1 and again.output_ids == out.output_ids  # same weights reloaded
    finally:
        await asyncio.to_thread(server.stop)
