"""Interpreter, ProgramState, fork/join, tracing, batching and errors, on the scripted FakeBackend."""

import asyncio
import subprocess
import sys
import time

import pytest

import sglpy as sgl
from sglpy.backend_fake import FakeBackend, complete_regex
from sglpy.chat_template import CHATML, ChatTemplate
from sglpy.backend_http import wire_sampling_params
from sglpy.grammar import DTYPE_REGEX
from sglpy.ir import GenParams, SamplingParams

pytestmark = pytest.mark.timeout(60)


def gens(backend):
    return [c[1] for c in backend.calls if c[0] in ("generate", "generate_stream")]


def test_import_and_lazy_backends_do_not_import_torch():
    code = "import sys, sglpy; sglpy.Engine; sglpy.RuntimeEndpoint; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_function_requires_s_first_and_works_bare_or_with_arguments():
    with pytest.raises(ValueError, match="must be named 's'"):
        sgl.function(lambda state: None)

    @sgl.function(num_api_spec_tokens=8)
    def prog(s, x):
        s += x

    assert prog.num_api_spec_tokens == 8 and prog.arg_names == ["x"]


def test_gen_overrides_program_defaults_and_template_stops_are_added():
    fb = FakeBackend()

    @sgl.function
    def prog(s):
        s += "a" + sgl.gen("x", max_tokens=5, stop="\n")
        s += "b" + sgl.gen("y")

    prog.run(backend=fb, temperature=0.3, max_new_tokens=7, stop=["END"]).sync()
    first, second = [g["params"].sampling for g in gens(fb)]
    assert (first.max_new_tokens, first.temperature, first.stop) == (5, 0.3, ("\n", "<|im_end|>"))
    assert (second.max_new_tokens, second.temperature, second.stop) == (7, 0.3, ("END", "<|im_end|>"))


def test_dtype_lowers_to_regex_and_stops():
    p = GenParams(SamplingParams(stop="x"), dtype=int).lowered()
    assert p.sampling.regex == DTYPE_REGEX["int"] and p.sampling.stop == ("x", " ", "\n") and p.dtype is None
    sp = wire_sampling_params(GenParams(dtype="bool").lowered().sampling)
    assert sp["regex"] == "(True|False)" and sp["json_schema"] is None
    with pytest.raises(ValueError, match="invalid dtype"):
        sgl.gen("x", dtype=list)


def test_bad_arguments_fail_in_the_caller():
    with pytest.raises(ValueError, match="invalid regex"):
        sgl.gen("x", regex="[unclosed")
    with pytest.raises(ValueError, match="temperature"):
        sgl.gen("x", temperature=-1)
    with pytest.raises(ValueError, match="json_schema is not valid JSON"):
        sgl.gen("x", json_schema="{nope")
    with pytest.raises(ValueError, match="non-empty"):
        sgl.select("x", [])
    with pytest.raises(TypeError, match="sgl.image takes a path"):
        sgl.image(3.5)


def test_roles_messages_and_both_syntaxes():
    fb = FakeBackend(responses=["hi there", "second"])

    @sgl.function
    def chat(s):
        s += sgl.system("sys")
        s += sgl.user("q1")
        s += sgl.assistant(sgl.gen("a1"))
        with s.user():
            s += "q2"
        with s.assistant():
            s += sgl.gen("a2")

    st = chat.run(backend=fb)
    assert st.messages() == [{"role": "system", "content": "sys"}, {"role": "user", "content": "q1"},
                             {"role": "assistant", "content": "hi there"}, {"role": "user", "content": "q2"},
                             {"role": "assistant", "content": "second"}]
    assert st.text() == ("<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nq1<|im_end|>\n"
                         "<|im_start|>assistant\nhi there<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n"
                         "<|im_start|>assistant\nsecond<|im_end|>\n")


def test_default_system_prompt_is_inserted_before_a_first_non_system_role():
    tpl = ChatTemplate("t", dict(CHATML.role_prefix_and_suffix), default_system_prompt="DEF", stop_str=("<|im_end|>",))
    fb = FakeBackend(chat_template=tpl)

    @sgl.function
    def chat(s):
        s += sgl.user("hello")

    assert chat.run(backend=fb).text().startswith("<|im_start|>system\nDEF<|im_end|>\n<|im_start|>user\nhello")


def test_nested_roles_raise_on_read():
    fb = FakeBackend()

    @sgl.function
    def bad(s):
        s += sgl.user_begin() + sgl.assistant_begin() + sgl.gen("x")

    st = bad.run(backend=fb)
    with pytest.raises(sgl.ProgramError, match="Nested roles"):
        st["x"]
    assert isinstance(st.error(), ValueError)


def test_var_scope_and_mid_program_read_and_meta_info():
    fb = FakeBackend(responses=["12", "rest"])

    @sgl.function
    def prog(s):
        with s.var_scope("obj"):
            s += "{" + sgl.gen("n", regex=r"[0-9]+") + "}"
        n = int(s["n"])  # blocks until generated
        s += f" twice={2 * n} " + sgl.gen("more", max_tokens=3)

    st = prog.run(backend=fb)
    assert st["obj"] == "{12}"
    assert st.text() == "{12} twice=24 res"
    assert st.get_meta_info("more")["finish_reason"] == {"type": "length", "length": 3}
    assert "n" in st and "missing" not in st


def test_variable_never_set_raises_instead_of_hanging():
    fb = FakeBackend()

    @sgl.function
    def prog(s):
        s += "hi" + sgl.gen("x")

    st = prog.run(backend=fb)
    with pytest.raises(KeyError, match="never set"):
        st["y"]


def test_backend_failure_surfaces_in_the_reader():
    fb = FakeBackend(fail_with=ConnectionError("server down"))

    @sgl.function
    def prog(s):
        s += "hi" + sgl.gen("x") + sgl.gen("y")

    with pytest.warns(RuntimeWarning, match="server down"):
        st = prog.run(backend=fb)
        with pytest.raises(sgl.ProgramError, match="server down") as info:
            st["y"]
    assert isinstance(info.value.__cause__, ConnectionError)
    assert isinstance(st.error(), ConnectionError)


def test_no_backend_is_a_clear_error():
    old = sgl.global_config.default_backend
    sgl.set_default_backend(None)
    try:
        @sgl.function
        def prog(s):
            s += "x"

        with pytest.raises(RuntimeError, match="set_default_backend"):
            prog.run()
    finally:
        sgl.set_default_backend(old)


def test_gen_is_non_blocking():
    fb = FakeBackend(delay=3.0)

    @sgl.function
    def prog(s):
        s += "a" + sgl.gen("x")

    t = time.perf_counter()
    st = prog.run(backend=fb)
    assert time.perf_counter() - t < 2.5  # run returned before the generation finished
    assert st["x"] == "fake answer"


def test_fork_caches_prefix_gathers_and_keeps_branch_text_out():
    fb = FakeBackend(responder=lambda text, sp: "A" if text.endswith("0:") else "B")

    @sgl.function
    def prog(s):
        s += "shared prefix. "
        forks = s.fork(2)
        forks += lambda i: f"branch {i}:" + sgl.gen("v", max_tokens=3)
        forks.join()
        s += "done " + forks[0]["v"] + forks[1]["v"]

    st = prog.run(backend=fb)
    assert st["v"] == ["A", "B"]
    assert st.text() == "shared prefix. done AB"
    assert ("cache_prefix", "shared prefix. ") in fb.calls
    assert sorted(g["text"] for g in gens(fb)) == ["shared prefix. branch 0:", "shared prefix. branch 1:"]


def test_fork_group_append_forms():
    fb = FakeBackend()

    @sgl.function
    def prog(s):
        forks = s.fork(3)
        forks += "x"
        forks += ["0", "1", "2"]
        forks[1] += "!"
        forks.join(mode="concate_and_append")

    assert prog.run(backend=fb).text() == "x0x1!x2"
    with pytest.raises(ValueError, match="join mode"):
        @sgl.function
        def bad(s):
            s.fork(2).join(mode="weird")

        bad.run(backend=fb)


def test_copy_context_joins_variables():
    fb = FakeBackend(responses=["inner"])

    @sgl.function
    def prog(s):
        s += "p "
        with s.copy() as c:
            c += "c " + sgl.gen("x")
        s += "after"

    st = prog.run(backend=fb)
    assert st["x"] == ["inner"] and st.text() == "p after"


def test_n_samples_become_a_list():
    fb = FakeBackend(responses=["one", "two", "three"])

    @sgl.function
    def prog(s):
        s += "go " + sgl.gen("x", n=3)

    st = prog.run(backend=fb)
    assert st["x"] == ["one", "two", "three"] and st.text() == "go one"


def test_streaming_yields_deltas_and_errors_at_the_end():
    fb = FakeBackend(default_response="abcdefghij", stream_chunk_chars=2, delay=0.02)

    @sgl.function
    def prog(s):
        s += "Q " + sgl.gen("x") + " end"

    st = prog.run(backend=fb, stream=True)
    chunks = list(st.text_iter("x"))
    assert len(chunks) > 1 and "".join(chunks) == "abcdefghij"
    st = prog.run(backend=fb, stream=True)
    assert "".join(st.text_iter()) == "Q abcdefghij end"

    @sgl.function
    def failing(s):
        s += "Q " + sgl.gen("x")
        raise RuntimeError("body broke")

    st = failing.run(backend=fb, stream=True)
    with pytest.raises(sgl.ProgramError, match="body broke"):
        list(st.text_iter())


def test_run_batch_order_errors_and_precache(capsys):
    fb = FakeBackend(responder=lambda text, sp: text.split("item ")[-1].split(":")[0])
    prefix = "A long constant instruction that every item of the batch shares, to be cached. "

    @sgl.function
    def prog(s, i):
        s += prefix
        if i == 2:
            raise ValueError("item two is bad")
        s += f"item {i}:" + sgl.gen("x")

    states = prog.run_batch([{"i": i} for i in range(5)], backend=fb, progress_bar=True, num_threads=3)
    assert [s.error() is None for s in states] == [True, True, False, True, True]
    assert [states[i]["x"] for i in (0, 1, 3, 4)] == ["0", "1", "3", "4"]
    with pytest.raises(sgl.ProgramError, match="item two"):
        states[2]["x"]
    assert [c for c in fb.calls if c[0] == "cache_prefix"] == [("cache_prefix", prefix)]
    assert "prog" in capsys.readouterr().err  # the tqdm bar
    with pytest.raises(ValueError, match="mismatch"):
        prog.run_batch([[0, 1]], backend=fb)


def test_run_batch_positional_and_generator_style():
    fb = FakeBackend(responder=lambda text, sp: text[-1])

    @sgl.function
    def prog(s, i):
        s += str(i) + sgl.gen("x")

    gen = prog.run_batch([[i] for i in range(4)], backend=fb, generator_style=True)
    assert [s["x"] for s in gen] == ["0", "1", "2", "3"]


def test_short_prefix_is_not_precached():
    fb = FakeBackend()

    @sgl.function
    def prog(s, i):
        s += "short " + sgl.gen("x")

    prog.run_batch([{"i": 1}, {"i": 2}], backend=fb)
    assert not [c for c in fb.calls if c[0] == "cache_prefix"]


def test_run_async():
    fb = FakeBackend(delay=0.3)

    @sgl.function
    def prog(s, name):
        s += name + sgl.gen("x", max_tokens=4)

    async def main():
        t = time.perf_counter()
        a, b = await asyncio.gather(prog.run_async(name="a", backend=fb), prog.run_async(name="b", backend=fb))
        return a, b, time.perf_counter() - t

    a, b, dt = asyncio.run(main())
    assert a.text() == "afake" and b.text() == "bfake"
    assert dt < 0.55  # ran concurrently (one after the other takes 0.6 s; the margin is for a loaded CI box)


def test_trace_graph_and_fstring_error():
    @sgl.function
    def prog(s, question):
        s += sgl.system("sys")
        s += "Q: " + question + sgl.gen("a", stop="\n")
        forks = s.fork(2)
        forks += sgl.select("c", ["x", "y"])

    lines = prog.trace().lines()
    assert lines[:5] == ["system_begin", "text 'sys'", "system_end", "text 'Q: '", "SglArgument('question')"]
    assert "fork 2" in lines and "  branch 1:" in lines and lines.count("    select 'c' choices=['x', 'y']") == 2

    @sgl.function
    def bad(s, question):
        s += f"Q: {question}"

    with pytest.raises(TypeError, match="f-string"):
        bad.trace()
    assert bad.bind(question="hi").trace().lines() == ["text 'Q: hi'"]


def test_cache_method_precaches_the_traced_prefix():
    fb = FakeBackend()

    @sgl.function
    def prog(s, q):
        s += sgl.system("Be brief.")
        s += sgl.user("Question: " + q)

    prefix = prog.cache(backend=fb)
    assert prefix == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nQuestion: "
    assert fb.calls == [("cache_prefix", prefix)]


def test_regex_completion_helper():
    assert complete_regex(r"[0-9]+", "42abc") == "42"
    assert complete_regex(r"(True|False)", "Fa") == "False"
    assert complete_regex(r"\"[\w\d\s]*\"", "nope") == '""'


def test_flush_cache_and_server_info_helpers():
    fb = FakeBackend()
    assert sgl.flush_cache(fb) is True
    assert sgl.get_server_info(fb)["backend"] == "fake"
    old = sgl.global_config.default_backend
    sgl.set_default_backend(None)
    try:
        assert sgl.flush_cache() is False and sgl.get_server_info() is None
    finally:
        sgl.set_default_backend(old)


def test_text_iter_of_select_and_var_scope_variables():
    fb = FakeBackend(choice_picker=lambda prefix, choices: 1)

    @sgl.function
    def prog(s):
        with s.var_scope("obj"):
            s += "{" + sgl.gen("n", regex=r"[0-9]+") + "}"
        s += " pick " + sgl.select("p", ["a", "b"])

    st = prog.run(backend=fb, stream=True)
    assert "".join(st.text_iter("p")) == "b"
    st = prog.run(backend=fb, stream=True)
    assert "".join(st.text_iter("obj")) == "{0}"


def test_reads_after_an_earlier_failure_do_not_hang():
    def responder(text, sp):
        if text.endswith("bad:"):
            raise RuntimeError("first gen failed")
        return "fine"

    fb = FakeBackend(responder=responder)

    @sgl.function
    def prog(s):
        s += "bad:" + sgl.gen("x")
        time.sleep(0.2)  # the failure happens before the next gen is submitted
        s += "next:" + sgl.gen("y")
        return s["y"]

    with pytest.warns(RuntimeWarning, match="first gen failed"):
        with pytest.raises(sgl.ProgramError, match="first gen failed"):
            prog.run(backend=fb)
