"""The frontend's per-request queue (testbed.serve.app.Job): outputs that queued while the
stream was behind come out as one (their text joined, the last one's counts), an error or
the client going away is never merged into text, and nothing queued before them is lost."""
from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("fastapi")
from testbed.serve.app import ClientGone, Job, ServerState  # noqa: E402
from testbed.serve.channels import Channels  # noqa: E402
from testbed.serve.messages import ErrorOut, TextOut  # noqa: E402


class FakeHttp:
    """A request whose client goes away when `leave` is set."""

    def __init__(self):
        self.leave = asyncio.Event()

    async def receive(self):
        await self.leave.wait()
        return {"type": "http.disconnect"}


def job_with(*outs):
    state = ServerState(Channels("a", "b", "c", "d"), "m", 100)
    http = FakeHttp()
    job = Job(state, 0, http)
    for o in outs:
        job.queue.put_nowait(o)
    return job, http


def text(t, n, finish=None):
    return TextOut(0, t, 5, n, finish)


def test_queued_outputs_come_out_as_one():
    async def go():
        job, _ = job_with(text("a", 1), text("b", 2), text("c", 3))
        o = await job.next()
        assert (o.text, o.completion_tokens, o.finish_reason) == ("abc", 3, None)
        job.queue.put_nowait(text("d", 4, "length"))
        job.queue.put_nowait(text("never", 5))  # nothing is merged past the end
        o = await job.next()
        assert (o.text, o.completion_tokens, o.finish_reason) == ("d", 4, "length")
        assert job.state.metrics.generation_tokens == 4
        job.gone.cancel()
    asyncio.run(go())


def test_an_error_after_text_comes_after_it():
    async def go():
        job, _ = job_with(text("a", 1), text("b", 2), ErrorOut(0, 503, "worker died"))
        assert (await job.next()).text == "ab"
        e = await job.next()
        assert isinstance(e, ErrorOut) and e.status == 503 and job.ended
        job.gone.cancel()
    asyncio.run(go())


def test_a_client_gone_ends_the_wait_after_what_had_come():
    async def go():
        job, http = job_with(text("a", 1))
        assert (await job.next()).text == "a"
        waiting = asyncio.ensure_future(job.next())
        await asyncio.sleep(0)
        assert not waiting.done()  # nothing queued: it waits
        http.leave.set()
        with pytest.raises(ClientGone):
            await asyncio.wait_for(waiting, 30)
    asyncio.run(go())
