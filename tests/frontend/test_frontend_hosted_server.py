"""Hosted-API backends against `sglpy serve` on a tiny random-weight model (constraints enforced by the real engine),
with the real clients. The held-in program suite (sglpy/testing_programs.py) on sgl.OpenAI(base_url=<our server>/v1):
and sgl.Anthropic(base_url=<our server>) over POST /v1/messages (the role / stop / stream / json_schema programs).

Completion mode (/v1/completions) runs every program. Chat mode (/v1/chat/completions) runs the programs whose
gens sit inside assistant turns; the others are skipped for the reason in CHAT_SKIP (a chat model answers
messages, so a gen in plain text has no request to become: SGLang's rule for OpenAI chat models).
"""

import pytest

import sglpy as sgl
from sglpy import testing_programs as programs
from sglpy.ir import REGEX_STR
from sglpy.runtime.testing.server_harness import run_server

pytest.importorskip("openai")

NAMES = sorted(programs.PROGRAMS)
CHAT_PROGRAMS = ("mt_bench", "json_schema", "stream", "gen_min_new_tokens")
CHAT_SKIP = {n: "its gens are outside an assistant turn: a chat model answers only inside sgl.assistant "
                "(runs in completion mode)" for n in NAMES if n not in CHAT_PROGRAMS}
# Programs whose structural check depends on the model, not the backend: on the random-weight model they are
# checked against sgl.RuntimeEndpoint on the same server instead (greedy: the same text, byte for byte).
MODEL_DEPENDENT = {"decode_json_regex": "DTYPE_REGEX['str'] admits control whitespace (\\s) that JSON rejects; "
                                        "a random-weight model emits it"}


@pytest.fixture(scope="module")
def srv(tiny_model_path):
    with run_server("--model", tiny_model_path, "--max-total-tokens", "16384", "--max-context-len", "1024",
                    "--num-threads", "1", "--served-model-name", "tiny", "--quantization", "none") as s:
        yield s


def _run(backend, name):
    old = sgl.global_config.default_backend
    sgl.set_default_backend(backend)
    try:
        programs.PROGRAMS[name]()
    finally:
        sgl.set_default_backend(old)


@pytest.fixture(scope="module")
def completion_backend(srv):
    return sgl.OpenAI("tiny", base_url=srv.url + "/v1", is_chat_model=False, max_retries=0)


@pytest.fixture(scope="module")
def chat_backend(srv):
    return sgl.OpenAI("tiny", base_url=srv.url + "/v1", max_retries=0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", NAMES)
def test_program_on_openai_completion_model(completion_backend, name):
    if name in MODEL_DEPENDENT:
        pytest.skip(MODEL_DEPENDENT[name] + " (test_model_dependent_program_matches_runtime_endpoint)")
    _run(completion_backend, name)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", NAMES)
def test_program_on_openai_chat_model(chat_backend, name):
    if name in CHAT_SKIP:
        pytest.skip(CHAT_SKIP[name])
    _run(chat_backend, name)


def test_model_dependent_program_matches_runtime_endpoint(srv, completion_backend):
    @sgl.function
    def decode_json(s):
        s += "Here is the information of London, in JSON format.\n{\n"
        s += '  "name": ' + sgl.gen("name", regex=REGEX_STR, max_tokens=12)
        s += ',\n  "population": ' + sgl.gen("population", dtype=int, max_tokens=8) + "\n}"

    a = decode_json.run(backend=completion_backend, temperature=0)
    b = decode_json.run(backend=sgl.RuntimeEndpoint(srv.url), temperature=0)
    assert a.text() == b.text() and a["population"] == b["population"]
    int(a["population"])


def test_select_scores_equal_the_native_endpoints(srv, completion_backend):
    """echo + logprobs over /v1/completions scores the same windows as /generate with /tokenize."""
    @sgl.function
    def pick(s):
        s += "Is the sky blue? Answer:" + sgl.select("a", [" yes", " no", " maybe not"])

    a = pick.run(backend=completion_backend)
    b = pick.run(backend=sgl.RuntimeEndpoint(srv.url))
    assert a["a"] == b["a"] and a.get_meta_info("a")["select_method"] == "prompt_logprobs"
    wa = [[e[0], e[2]] for e in a.get_meta_info("a")["input_token_logprobs"][0]]
    wb = [[e[0], e[2]] for e in b.get_meta_info("a")["input_token_logprobs"][0]]
    assert [t for _, t in wa] == [t for _, t in wb]
    # the two routes batch the prompts differently, so float32 rounding differs in the last places
    assert [lp for lp, _ in wa] == pytest.approx([lp for lp, _ in wb], abs=1e-3)


def test_chat_select_is_constrained_on_our_server(chat_backend):
    @sgl.function
    def pick(s):
        s += sgl.user("Pick a color.")
        s += sgl.assistant(sgl.select("c", COLORS))

    COLORS = ["red", "green", "light blue (sky).", "a+b|c*"]  # regex metacharacters are escaped
    state = pick.run(backend=chat_backend)
    assert state["c"] in COLORS
    assert state.get_meta_info("c")["select_method"] == "constrained_regex"


def test_regex_and_dtype_go_through_extra_body(chat_backend):
    @sgl.function
    def prog(s):
        s += sgl.user("An IP address and a number.")
        s += sgl.assistant(sgl.gen("ip", regex=programs.IP_REGEX, max_tokens=16))
        s += sgl.user("And a number?")
        s += sgl.assistant(sgl.gen_int("n", max_tokens=6))

    state = prog.run(backend=chat_backend, temperature=0)
    import re

    assert re.fullmatch(programs.IP_REGEX, state["ip"]) and re.fullmatch(r"[-+]?\d+", state["n"])


# ---------------------------------------------------------------- sgl.Anthropic against POST /v1/messages

ANTHROPIC_PROGRAMS = ("mt_bench", "json_schema", "stream")  # roles + system, json_schema via a tool, streaming


@pytest.fixture(scope="module")
def anthropic_backend(srv):
    pytest.importorskip("anthropic")
    return sgl.Anthropic("tiny", base_url=srv.url, max_retries=0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ANTHROPIC_PROGRAMS)
def test_program_on_anthropic(anthropic_backend, name):
    _run(anthropic_backend, name)


def test_anthropic_stop_sequences_system_and_prefill(anthropic_backend, srv):
    @sgl.function
    def prog(s):
        s += sgl.system("Answer briefly.")
        s += sgl.user("Count.")
        with s.assistant():
            s += "One," + sgl.gen("rest", max_tokens=24, stop=[",", " "])

    state = prog.run(backend=anthropic_backend, temperature=0)
    meta = state.get_meta_info("rest")
    assert "," not in state["rest"] and " " not in state["rest"]
    assert meta["finish_reason"]["type"] in ("stop_sequence", "max_tokens", "end_turn")
    if meta["finish_reason"]["type"] == "stop_sequence":
        assert meta["finish_reason"]["matched"] in (",", " ")
    # the prefill is continued: the same text as the OpenAI route continuing the same assistant message
    oa = sgl.OpenAI("tiny", base_url=srv.url + "/v1", max_retries=0)
    assert prog.run(backend=oa, temperature=0)["rest"] == state["rest"]


def test_anthropic_select_and_unsupported(anthropic_backend):
    @sgl.function
    def pick(s):
        s += sgl.user("Pick a color.")
        s += sgl.assistant(sgl.select("c", ["red", "green"]))

    state = pick.run(backend=anthropic_backend)
    assert state["c"] in ("red", "green") and state.get_meta_info("c")["select_method"] == "tool_enum"

    @sgl.function
    def regex(s):
        s += sgl.user("x")
        s += sgl.assistant(sgl.gen("a", regex="[a-z]+", max_tokens=4))

    with pytest.raises(sgl.ProgramError, match=r"gen\(regex=...\) / dtype is not supported by sgl.Anthropic"):
        regex.run(backend=anthropic_backend)["a"]


# ---------------------------------------------------------------- sgl.LiteLLM (the real package, when installed)


@pytest.mark.slow  # importing litellm takes seconds; the shim is covered fast in test_frontend_openai_spec.py
@pytest.mark.parametrize("name", ("mt_bench", "json_schema", "stream"))
def test_program_on_litellm(srv, name):
    pytest.importorskip("litellm", reason="litellm is an optional extra (pip install -e '.[litellm]')")
    _run(sgl.LiteLLM("openai/tiny", base_url=srv.url + "/v1", api_key="unused", max_retries=0), name)


def test_hosted_backends_example(srv):
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
    try:
        import hosted_backends
    finally:
        sys.path.pop(0)
    out = hosted_backends.main(srv.url)
    assert out["openai-chat"][1] in hosted_backends.COLORS and out["openai-chat"][2] == "constrained_regex"
    assert out["anthropic"][1] in hosted_backends.COLORS and out["anthropic"][2] == "tool_enum"
    assert len(out["profile"][0]) == 3 and out["pick"][0] in (" yes", " no")


def test_anthropic_speculative_turn(anthropic_backend):
    """A 3-gen turn: one call on a hit; on a miss one more call per gen, each a prefill continuing the turn,
    which then equals the program run without speculation (greedy, the same continuations)."""
    def program(spec):
        @sgl.function(num_api_spec_tokens=spec)
        def character(s):
            s += sgl.user("Make up a character.")
            s += sgl.assistant("Name:" + sgl.gen("name", stop="\n", max_tokens=6) + "\nAge:"
                               + sgl.gen("age", stop="\n", max_tokens=6) + "\nJob:" + sgl.gen("job", stop="\n",
                                                                                            max_tokens=6))

        return character

    anthropic_backend.token_usage.reset()
    spec = program(24).run(backend=anthropic_backend, temperature=0)
    spec.sync()  # every call made before counting
    outcome = spec.get_meta_info("name")["api_spec"]
    calls = anthropic_backend.token_usage.calls
    assert (outcome, calls) in (("hit", 1), ("miss", 4))
    if outcome == "miss":
        plain = program(None).run(backend=anthropic_backend, temperature=0)
        assert [spec[k] for k in ("name", "age", "job")] == [plain[k] for k in ("name", "age", "job")]
