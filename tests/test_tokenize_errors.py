"""What a client gets when tokenizing fails on the worker (server/daemon_requests.py): its
own input is a 400, a tokenizer bug the worker caught is a 500 (retrying would fail
again), a worker that is not there is a 503 with Retry-After (it comes back). The worker
behind the Worker protocol is a fake at the edge; the rest is the daemon's own code."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from janusd.core.requests import Refused
from janusd.server.daemon_requests import RequestFront
from janusd.server.openai_types import Parsed
from janusd.server.workers import WorkerError
from janusd.wire import worker_msgs as wm


class _Worker:
    def __init__(self, error: WorkerError) -> None:
        self.error = error

    async def call(self, make, timeout_s):  # type: ignore[no-untyped-def]
        raise self.error


def _front(error: WorkerError) -> SimpleNamespace:
    core = SimpleNamespace(tokenizer_device=lambda model: 0, registry=SimpleNamespace(model=lambda n: object()))
    return SimpleNamespace(cfg=SimpleNamespace(server=SimpleNamespace(model_wait_timeout_s=1.0)), core=core,
                           workers={0: _Worker(error)})


@pytest.mark.parametrize("kind, status", [("bad_request", 400), ("internal", 500), ("unavailable", 503)])
def test_each_kind_of_tokenize_failure_gets_its_status(kind, status):
    p = Parsed(model="m", chat=True, messages=[wm.ChatMessage("user", "hi")], sampling=wm.SamplingSpec(max_tokens=2),
               max_tokens_given=True, stream=False, include_usage=False)
    with pytest.raises(Refused) as e:
        asyncio.run(RequestFront._tokenize(_front(WorkerError("boom", kind)), p, 0.0))  # type: ignore[arg-type]
    f = e.value.failure
    assert f.status == status and "boom" in f.message
    assert (f.retry_after_s is not None) == (status == 503)

