"""GrammarService: compiles in worker processes, CPU budget, cancellation, crashes, cache; guide transfer; sandbox."""

import concurrent.futures
import inspect
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from sglpy.grammar import GrammarCompiler, GrammarError
from sglpy.grammar.budget import COMPILE_CLOCK, COMPILE_TIME_S
from sglpy.grammar.errors import BudgetExceeded
from sglpy.grammar.testing import small_vocab_info
from sglpy.runtime.config import EngineConfig
from sglpy.runtime.engine.grammar_service import CompileServiceError, GrammarService
from sglpy.runtime.engine.grammar_worker import pack_guide, unpack_guide

INFO = small_vocab_info()
SLOW = "(a{0,100}){0,100}(b{0,100}){0,100}"  # minutes of DFA construction without a budget
EBNF = 'start: "[" NUMBER ("," NUMBER)* "]"\n%import common.NUMBER'


@pytest.fixture(scope="module")
def service():
    svc = GrammarService(INFO, workers=2, timeout_s=1.0)
    yield svc
    svc.close()


def _same_guide(a, b, text: bytes):
    s, t = a.initial_state, b.initial_state
    assert np.array_equal(a.allowed(s), b.allowed(t))
    for byte in text:
        s, t = a.advance_bytes(s, bytes([byte])), b.advance_bytes(t, bytes([byte]))
        assert np.array_equal(a.allowed(s), b.allowed(t))
    assert a.is_final(s) == b.is_final(t)


@pytest.mark.parametrize("kind,value,text", [
    ("regex", r"[a-c]{2,4}-[0-9]+", b"ab-12"),
    ("choices", ("yes", "no"), b"no"),
    ("ebnf", EBNF, b"[1,22]"),
    ("json_schema", '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}', b'{"a": 5}'),
])
def test_worker_compiles_the_same_guide_as_in_process(service, kind, value, text):
    got = service.compile(kind, value).result(timeout=60)
    ref = GrammarCompiler(INFO).compile(kind, list(value) if kind == "choices" else value)
    _same_guide(got, ref, text)
    assert got.info is INFO  # bound to this process's vocabulary, not a copy


def test_pack_unpack_shares_the_vocabulary_tables():
    g = GrammarCompiler(INFO).compile("ebnf", EBNF)
    payload = pack_guide(g, INFO)
    back = unpack_guide(payload, INFO)
    assert back.info is INFO and back._fb is INFO.first_byte_masks
    _same_guide(back, g, b"[3]")


def test_cache_hit_is_done_at_once_and_in_flight_compiles_are_shared(service):
    a, b = service.compile("regex", r"x[0-9]{3}"), service.compile("regex", r"x[0-9]{3}")
    assert a.result(timeout=60) is b.result(timeout=60)
    hits = service.stats["cache_hits"]
    c = service.compile("regex", r"x[0-9]{3}")
    assert c.done() and c.result() is a.result() and service.stats["cache_hits"] == hits + 1


def test_bad_constraints_are_grammar_errors(service):
    with pytest.raises(GrammarError, match="regex"):
        service.compile("regex", "(unclosed").result(timeout=60)
    with pytest.raises(GrammarError, match="refused"):
        service.compile("ebnf", "%import etc.passwd (X)\nstart: X").result(timeout=60)
    deep = '{"type":"array","items":' * 3000 + '{"type":"integer"}' + "}" * 3000
    with pytest.raises(GrammarError):
        service.compile("json_schema", deep).result(timeout=60)


def test_a_compile_past_its_budget_fails_alone_and_the_service_keeps_serving(service):
    timeouts = service.stats["timeouts"]
    slow = service.compile("regex", SLOW)
    quick = service.compile("regex", r"q[0-9]{2}")  # the other worker serves it meanwhile
    assert quick.result(timeout=120) is not None
    with pytest.raises(BudgetExceeded, match="budget"):
        slow.result(timeout=120)  # 1 s of its CPU (or the 20 s wall cap when the box starves the worker)
    assert service.stats["timeouts"] == timeouts + 1
    assert service.compile("regex", r"after[0-9]").result(timeout=60) is not None


def test_one_budget_one_answer_on_every_path(service):
    """A constraint gets the same answer from GrammarCompiler, the worker processes and the thread mode: one
    budget (value and clock), enforced by the compiler itself, with the compiler's own error."""
    service_default = inspect.signature(GrammarService).parameters["timeout_s"].default
    assert GrammarCompiler(INFO).compile_timeout_s == service_default == COMPILE_TIME_S
    assert EngineConfig.__dataclass_fields__["grammar_compile_timeout"].default == COMPILE_TIME_S
    assert GrammarCompiler(INFO).budget_clock == COMPILE_CLOCK == "cpu"
    direct = GrammarCompiler(INFO, compile_timeout_s=service.timeout_s, cache_size=0)
    threads = GrammarService(INFO, workers=0, timeout_s=service.timeout_s)
    try:
        answers = []
        for compile_ in (lambda v: direct.compile("regex", v), lambda v: service.compile("regex", v).result(120),
                         lambda v: threads.compile("regex", v).result(120)):
            with pytest.raises(BudgetExceeded) as e:
                compile_(SLOW + "e")
            assert compile_(r"ok[0-9]{2}") is not None
            answers.append(re.sub(r"while building .*", "", str(e.value)))
        assert answers == [f"compile time budget ({service.timeout_s:g} s) exceeded "] * 3
        assert threads.stats["timeouts"] == 1
    finally:
        threads.close()


def test_cancelling_the_only_waiter_stops_the_compile(service):
    cancelled = service.stats["cancelled"]
    fut = service.compile("regex", SLOW + "c")
    time.sleep(0.3)  # let a worker take it
    assert fut.cancel()
    deadline = time.monotonic() + 30
    while any(w.job is not None for w in service._workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(w.job is not None for w in service._workers), "the cancelled compile still occupies a worker"
    assert service.stats["cancelled"] == cancelled + 1
    assert service.compile("regex", r"next[0-9]").result(timeout=60) is not None


def test_one_cancelled_waiter_does_not_stop_a_shared_compile(service):
    a, b = service.compile("regex", r"shared[a-z]{1,9}"), service.compile("regex", r"shared[a-z]{1,9}")
    a.cancel()
    assert b.result(timeout=60) is not None


def test_a_worker_crash_fails_only_its_compile(service):
    fut = service.compile("regex", SLOW + "d")
    deadline = time.monotonic() + 60
    while not any(w.job is not None and w.job.value == SLOW + "d" for w in service._workers):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    victim = next(w for w in service._workers if w.job is not None and w.job.value == SLOW + "d")
    victim.proc.kill()
    with pytest.raises(CompileServiceError, match="died") as e:  # the server's fault, not the constraint's
        fut.result(timeout=30)
    assert not isinstance(e.value, ValueError)
    assert service.compile("regex", r"alive[0-9]").result(timeout=60) is not None


class _DeadPipe:
    """A worker's command pipe whose reader has exited: sending fails."""

    def __init__(self, conn):
        self.conn = conn

    def send(self, obj):
        raise BrokenPipeError(32, "Broken pipe")

    def close(self):
        self.conn.close()


def test_a_worker_found_dead_at_hand_over_never_fails_the_compile():
    service = GrammarService(INFO, workers=2, timeout_s=1.0)
    try:
        assert service.compile("regex", r"warm[0-9]").result(timeout=60) is not None
        deadline = time.monotonic() + 60
        while not all(w.ready and w.job is None for w in service._workers) or len(service._workers) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        idle = list(service._workers)
        for w in idle:  # each died between jobs and its exit was not read yet: the hand-over finds a broken pipe
            w.send_conn = _DeadPipe(w.send_conn)
        assert service.compile("regex", r"after[0-9]").result(timeout=60) is not None  # on fresh workers
        assert all(w not in service._workers for w in idle)
    finally:
        service.close()


def test_thread_mode_compiles_in_process():
    svc = GrammarService(INFO, workers=0)
    try:
        assert svc.compile("regex", r"t[0-9]").result(timeout=60) is not None
        with pytest.raises(GrammarError):
            svc.compile("regex", "(").result(timeout=60)
    finally:
        svc.close()


def test_the_worker_sandbox_refuses_files_sockets_and_processes(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("x")
    code = f"""
import socket, subprocess
from sglpy.runtime.engine.grammar_worker import _Sandbox
box = _Sandbox(); box.arm()
import json.tool  # a lazy import still reads code
for attempt in (lambda: open({str(secret)!r}), lambda: socket.create_connection(("127.0.0.1", 9)),
                lambda: subprocess.run(["true"])):
    try:
        attempt(); print("allowed")
    except PermissionError:
        print("refused")
print(box.refused)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["refused", "refused", "refused", "3"], out.stderr


def test_many_concurrent_compiles_all_answer(service):
    futs = [service.compile("regex", f"n{i}[0-9]{{1,3}}") for i in range(20)]
    done, _ = concurrent.futures.wait(futs, timeout=120)
    assert len(done) == 20 and all(f.exception() is None for f in futs)


def test_a_long_compile_drops_to_the_lowest_priority_and_its_worker_is_replaced():
    import os

    from sglpy.runtime.engine.grammar_service import DEMOTE_S, DEMOTED_NICE, NICE, _cpu_seconds

    svc = GrammarService(INFO, workers=1, timeout_s=DEMOTE_S + 2.0)
    try:
        assert svc.compile("regex", "warm[0-9]").result(timeout=120) is not None
        w = svc._workers[0]
        assert os.getpriority(os.PRIO_PROCESS, w.proc.pid) == NICE
        fut = svc.compile("regex", SLOW)
        deadline = time.monotonic() + 120
        while not w.demoted:
            assert time.monotonic() < deadline and not fut.done(), "never demoted"
            time.sleep(0.05)
        assert _cpu_seconds(w.proc.pid) is not None
        assert os.getpriority(os.PRIO_PROCESS, w.proc.pid) == DEMOTED_NICE
        with pytest.raises(GrammarError, match="budget"):
            fut.result(timeout=120)
        deadline = time.monotonic() + 60
        while w in svc._workers:
            assert time.monotonic() < deadline, "the demoted worker was kept"
            time.sleep(0.05)
        assert svc.compile("regex", "fresh[0-9]").result(timeout=120) is not None
        assert os.getpriority(os.PRIO_PROCESS, svc._workers[0].proc.pid) == NICE
    finally:
        svc.close()


def _workers_die_while_starting(monkeypatch, deaths: int) -> list:
    """The first `deaths` worker starts exit before they read their vocabulary; returns the list of starts."""
    import sglpy.runtime.engine.grammar_service as gs

    real_popen, calls = gs.subprocess.Popen, []

    def popen(cmd, **kw):
        calls.append(cmd)
        dead = len(calls) <= deaths
        proc = real_popen([sys.executable, "-c", "pass"] if dead else cmd, **kw)
        if dead:
            proc.wait()  # gone before its init is sent: no reader on its pipe
        return proc

    monkeypatch.setattr(gs.subprocess, "Popen", popen)
    return calls


def test_a_worker_that_dies_while_starting_is_replaced(monkeypatch):
    # A worker killed before it read its vocabulary made the init send raise BrokenPipeError on the dispatcher
    # thread, which ended the service: every later constrained request failed with "the compile service stopped".
    calls = _workers_die_while_starting(monkeypatch, 1)
    svc = GrammarService(INFO, workers=1)
    try:
        assert svc.compile("regex", r"up[0-9]").result(timeout=60) is not None
        assert len(calls) == 2 and svc.stats["worker_starts"] == 2
    finally:
        svc.close()


def test_workers_that_keep_dying_while_starting_pause_the_service_then_it_serves_again(monkeypatch):
    # Five failed starts in a row used to end constrained decoding for the engine's life (the storm's compile-worker
    # kills hit starting workers): now pending compiles fail with a 503-class error and starts resume after a pause.
    import sglpy.runtime.engine.grammar_service as gs

    calls = _workers_die_while_starting(monkeypatch, gs.START_TRIES)
    svc = GrammarService(INFO, workers=1)
    try:
        with pytest.raises(CompileServiceError, match="fails to start"):
            svc.compile("regex", r"first[0-9]").result(timeout=60)
        time.sleep(1.5)  # the first pause is 1 s
        assert svc.compile("regex", r"again[0-9]").result(timeout=60) is not None
        assert len(calls) == gs.START_TRIES + 1
    finally:
        svc.close()
