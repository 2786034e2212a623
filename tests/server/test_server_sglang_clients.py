"""sglpy's frontend programs (sglpy.testing_programs) through SGLang's own clients: sglang 0.5.23's frontend
(`sgl.RuntimeEndpoint`) against `sglpy serve`, directly and through sglang-router 0.3.2.

The fake engine runs the programs that need no constrained decoding; the real default model (slow) runs the
constrained ones. Programs that cannot pass for reasons in the clients or the router are strict xfails with the
reason: they alert when they start passing. No request from either client may be refused by the server.
"""

import threading
import time

import pytest
import requests

from sglpy import testing_programs
from sglpy.runtime.testing.router_cluster import router_missing_reason, run_router
from sglpy.runtime.testing.server_harness import FAKE, run_server
from sglpy.runtime.testing.sglang_programs import CONSTRAINED, run_programs, sglang_missing_reason

LIGHT = sorted(n for n in testing_programs.PROGRAMS if n not in CONSTRAINED)
HEAVY = sorted(CONSTRAINED)

# Why a program cannot pass through SGLang's frontend, whatever this server does.
CLIENT_CAUSES = {
    "run_async": "SGLang's frontend has no SglFunction.run_async",
}
# ... and through sglang-router 0.3.2 (observed; the router tests below send each program through it)
ROUTER_CAUSES = {
    **CLIENT_CAUSES,
    "select": "sglang-router answers 422 to select's batch `text: [...]` (its /generate schema takes one string)",
    "react": "uses select: sglang-router 422 for batch text",
    "parallel_encoding": "sglang-router has no /concate_and_append_request (404); SGLang's client then hangs",
    "json_schema": "sglang-router answers 422 to a json_schema object (its schema takes a string)",
}


def _params(names, causes):
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=causes[n])) if n in causes else n
            for n in names]


def _assert_nothing_refused(log: str):
    refused = [line for line in log.splitlines() if " rejected route=" in line or "outcome=error 4" in line]
    assert refused == [], "requests of SGLang's clients were refused:\n" + "\n".join(refused[:10])


@pytest.fixture(scope="module")
def tools():
    reason = sglang_missing_reason()
    if reason:
        pytest.skip(reason)
    return router_missing_reason()  # None when the router can run


@pytest.fixture(scope="module")
def fake_direct(tools):
    with run_server("--engine-factory", FAKE, env={"SGLPY_FAKE_TOKEN_DELAY": "0.002"}) as srv:
        yield run_programs(srv.url, LIGHT, timeout=60), srv


@pytest.fixture(scope="module")
def fake_router(tools):
    if tools:
        pytest.skip(tools)
    env = {"SGLPY_FAKE_TOKEN_DELAY": "0.002"}
    with run_server("--engine-factory", FAKE, env=env) as w1, run_server("--engine-factory", FAKE, env=env) as w2:
        with run_router([w1.url, w2.url]) as router:
            results = run_programs(router.url, LIGHT, timeout=15)  # 15 s: a hang is the expected failure
            yield results, (w1, w2), _router_view(router.url)


def _router_view(url: str) -> dict:
    """The router's /workers and, while one long generation runs, its /get_loads (which polls our /get_load)."""
    long = threading.Thread(target=requests.post, args=(url + "/generate",),
                            kwargs={"json": {"text": "a long one", "sampling_params": {"max_new_tokens": 1000}},
                                    "timeout": 120})
    long.start()
    loads = {}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(loads.values()):
        loads = {w["worker"]: w["load"] for w in requests.get(url + "/get_loads", timeout=10).json()["workers"]}
        time.sleep(0.1)
    long.join()
    return {"workers": requests.get(url + "/workers", timeout=10).json()["workers"], "loads": loads}


@pytest.fixture(scope="module")
def real(tools):
    """The default model: the constrained programs directly, then through a router in front of the same server."""
    with run_server(startup_timeout=600) as srv:  # torch threads: the test run's share (tests/conftest.py)
        direct = run_programs(srv.url, HEAVY, timeout=300)
        routed = None
        if not tools:
            with run_router([srv.url]) as router:
                routed = run_programs(router.url, HEAVY, timeout=300)
        yield direct, routed, srv


def _check(result):
    assert result.outcome == "PASS", f"{result.outcome} after {result.seconds} s: {result.error}"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", _params(LIGHT, CLIENT_CAUSES))
def test_light_program_via_sglang_frontend(fake_direct, name):
    _check(fake_direct[0][name])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", _params(LIGHT, ROUTER_CAUSES))
def test_light_program_via_sglang_router(fake_router, name):
    _check(fake_router[0][name])


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", _params(HEAVY, CLIENT_CAUSES))
def test_constrained_program_via_sglang_frontend(real, name):
    _check(real[0][name])


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", _params(HEAVY, ROUTER_CAUSES))
def test_constrained_program_via_sglang_router(real, name):
    if real[1] is None:
        pytest.skip(router_missing_reason())
    _check(real[1][name])


def test_router_reads_worker_metadata_and_load(fake_router):
    view = fake_router[2]
    for w in view["workers"]:
        assert w["is_healthy"] and w["model_id"] == "fake-model"
        assert {k: w["metadata"].get(k) for k in ("tp_size", "dp_size")} == {"tp_size": "1", "dp_size": "1"}
    assert sorted(view["loads"].values())[-1] > 0  # KV tokens of the running request, from /get_load


def test_no_request_of_sglangs_frontend_is_refused(fake_direct):
    _assert_nothing_refused(fake_direct[1].log())


def test_no_request_through_sglang_router_is_refused(fake_router):
    logs = [worker.log() for worker in fake_router[1]]
    for log in logs:
        _assert_nothing_refused(log)
        assert "Traceback" not in log and "HTTP/2 or gRPC probe" in log  # the router's probes: one line each
    assert any("outcome=ok" in log for log in logs)  # (cache_aware sends sequential new prompts to one worker)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_no_request_on_the_real_model_is_refused(real):
    _assert_nothing_refused(real[2].log())
