"""The backend-agnostic test programs (sglpy.testing_programs) on the fake backend, the in-process
engine on the default model, and our HTTP server (through sgl.Runtime / RuntimeEndpoint)."""

import pytest

import sglpy as sgl
from sglpy import testing_programs as programs
from sglpy.backend_fake import FakeBackend

NAMES = sorted(programs.PROGRAMS)


@pytest.fixture
def fake_backend():
    old = sgl.global_config.default_backend
    backend = FakeBackend()
    sgl.set_default_backend(backend)
    yield backend
    sgl.set_default_backend(old)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", NAMES)
def test_program_on_fake_backend(fake_backend, name):
    programs.PROGRAMS[name]()


@pytest.fixture(scope="module")
def engine_backend():
    return programs.shared_engine()


@pytest.fixture(scope="module")
def http_runtime():
    runtime = sgl.Runtime()
    yield runtime
    runtime.shutdown()


def _run(backend, name):
    old = sgl.global_config.default_backend
    sgl.set_default_backend(backend)
    try:
        programs.PROGRAMS[name]()
    finally:
        sgl.set_default_backend(old)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", NAMES)
def test_program_on_engine(engine_backend, name):
    _run(engine_backend, name)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", NAMES)
def test_program_over_http(http_runtime, name):
    _run(http_runtime.endpoint, name)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_http_and_engine_agree_on_templates_and_select_windows(engine_backend, http_runtime):
    """The server's jinja template and /tokenize give the same role strings and scored windows as in-process."""
    ep = http_runtime.endpoint
    assert ep.get_chat_template().role_prefix_and_suffix == engine_backend.get_chat_template().role_prefix_and_suffix
    assert ep.get_chat_template().default_system_prompt == engine_backend.get_chat_template().default_system_prompt
    assert ep.get_chat_template().stop_str == engine_backend.get_chat_template().stop_str

    @sgl.function
    def pick(s):
        s += "Is the sky blue? Answer: " + sgl.select("a", ["yes", "no", "maybe not"])

    a = pick.run(backend=engine_backend)
    b = pick.run(backend=ep)
    assert a["a"] == b["a"]
    wa = a.get_meta_info("a")["input_token_logprobs"]
    wb = b.get_meta_info("a")["input_token_logprobs"]
    assert [[e[1] for e in w] for w in wa] == [[e[1] for e in w] for w in wb]
    for x, y in zip(wa, wb):
        assert [e[0] for e in x] == pytest.approx([e[0] for e in y], abs=1e-3)
    # The prefix ends with a space that the tokenizer merges into the choice: the merged token is scored.
    assert wa[0][0][2] == " yes"
    assert http_runtime.process.poll() is None


@pytest.mark.slow
def test_runtime_rejects_a_bad_model_path_clearly(tmp_path):
    with pytest.raises(RuntimeError, match="exited with code"):
        sgl.Runtime(model_path=str(tmp_path / "no-such-model"), launch_timeout=120)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fork_branches_hit_the_cached_prefix(engine_backend):
    """fork(n>1) prefills the shared prefix once; every branch's request then reports it as cached."""
    shared = "A shared instruction that every branch starts with. " * 8

    @sgl.function
    def prog(s):
        s += shared
        forks = s.fork(3)
        forks += lambda i: f"Branch {i}:" + sgl.gen("x", max_tokens=2)
        forks.join()

    st = prog.run(backend=engine_backend, temperature=0)
    prefix_tokens = len(engine_backend.tokenize(shared))
    metas = st.get_meta_info("x")
    assert len(metas) == 3
    assert all(m["cached_tokens"] >= prefix_tokens - 1 for m in metas), [m["cached_tokens"] for m in metas]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("which", ["engine", "http"])
def test_runtime_rejected_regex_fails_the_program_and_the_backend_keeps_serving(which, request):
    backend = request.getfixturevalue("engine_backend") if which == "engine" \
        else request.getfixturevalue("http_runtime").endpoint

    @sgl.function
    def lookahead(s):
        s += "x: " + sgl.gen("x", regex=r"(?<=a)b", max_tokens=4)  # valid for Python's re, not for the grammar

    with pytest.warns(RuntimeWarning):
        st = lookahead.run(backend=backend)
        with pytest.raises(sgl.ProgramError, match="(?i)lookahead|unsupported"):
            st["x"]

    @sgl.function
    def fine(s):
        s += "Count: 1, 2," + sgl.gen("x", max_tokens=3)

    assert isinstance(fine.run(backend=backend, temperature=0)["x"], str)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_select_is_one_prefill_plus_the_choice_tokens(engine_backend):
    """The choices' scoring requests find the prefix in the radix cache (meta_info['cached_tokens'])."""
    prefix = "Read the statement and judge it. " * 6 + "Statement: water is dry. Verdict:"

    @sgl.function
    def judge(s):
        s += prefix + sgl.select("v", ["True", "False", "Unknown"])

    meta = judge.run(backend=engine_backend).get_meta_info("v")
    prefix_tokens = len(engine_backend.tokenize(prefix))
    assert all(c >= prefix_tokens - 1 for c in meta["cached_tokens"]), (meta["cached_tokens"], prefix_tokens)
