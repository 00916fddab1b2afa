"""The embedded engine's streamed requests: a `Step` per decode step, the same final output as
`submit`, and aborts that free the batch at once."""

from __future__ import annotations

import asyncio

import pytest

from swarmrl.services.engine.engine_core import EngineCore
from swarmrl.services.engine.outputs import GenerationOutput, Step
from tests.unit.engine.helpers import params, wait_until

PROMPT = [5, 17, 33, 90, 4]


async def test_steps_arrive_per_token_and_end_with_the_submit_output(engine: EngineCore) -> None:
    sp = params(engine, max_new_tokens=12, ignore_eos=True, temperature=0)
    items = [item async for item in engine.stream(PROMPT, sp)]
    steps, final = items[:-1], items[-1]
    assert isinstance(final, GenerationOutput) and all(isinstance(s, Step) for s in steps)
    assert final.output_ids == engine.submit(PROMPT, sp).result(30).output_ids
    assert len(steps) > 1  # not one lump at the end (steps a slow reader misses are merged)
    for step in steps:
        n = len(step.output_ids)
        assert 1 <= n < 12 and step.output_ids == final.output_ids[:n]
        assert step.output_logprobs == final.output_logprobs[:n]
        assert (step.prompt_tokens, step.weight_version) == (len(PROMPT), final.weight_version)
    assert [len(s.output_ids) for s in steps] == sorted({len(s.output_ids) for s in steps})


async def test_a_reader_that_leaves_aborts_the_request(engine: EngineCore) -> None:
    before = engine.stats()["requests_aborted"]
    sp = params(engine, max_new_tokens=2000, ignore_eos=True, temperature=0)
    stream = engine.stream(PROMPT, sp)
    async for item in stream:
        assert isinstance(item, Step)
        if len(item.output_ids) >= 3:
            break  # asyncio closes the abandoned iteration, which aborts the request
    await asyncio.to_thread(
        wait_until, lambda: engine.stats()["requests_aborted"] == before + 1, what="the row dropped"
    )
    assert stream.future.cancelled()
    assert engine.stats()["running"] == 0 and engine.stats()["queued"] == 0
    # the engine goes on serving, and a cancelled plain `generate` is dropped the same way
    task = asyncio.create_task(engine.generate(PROMPT, sp))
    await asyncio.to_thread(wait_until, lambda: engine.stats()["running"] == 1, what="generate to run")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.to_thread(
        wait_until, lambda: engine.stats()["requests_aborted"] == before + 2, what="the second row dropped"
    )
    short = params(engine, max_new_tokens=3, ignore_eos=True)
    assert len((await engine.generate(PROMPT, short)).output_ids) == 3


async def test_an_abort_while_queued_costs_no_forward(tiny_model_dir) -> None:
    core = EngineCore(tiny_model_dir, max_batch=1)
    try:
        sp = params(core, max_new_tokens=40, ignore_eos=True)
        first = core.stream(PROMPT, sp)
        queued = core.stream([7, 8], sp)  # waits: the batch holds one row
        queued.abort()
        out = [item async for item in first][-1]
        assert isinstance(out, GenerationOutput) and len(out.output_ids) == 40
        await asyncio.to_thread(wait_until, lambda: core.stats()["requests_aborted"] == 1, what="drop")
        assert core.stats()["requests_finished"] == 1 and core.stats()["tokens_generated"] == 40
    finally:
        core.close()
