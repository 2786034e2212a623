"""sgl.Engine's request plumbing against a stub runtime engine (no model): the exact generate() calls."""

import pytest

import sglpy as sgl
from sglpy.backend_engine import Engine
from sglpy.runtime.sampling_params import SamplingParams

pytestmark = pytest.mark.timeout(60)


class StubTokenizer:
    name_or_path = "stub/SmolLM2-135M-Instruct"  # no chat_template attribute: ChatML by name

    def encode(self, text):
        return [ord(c) for c in text]


class StubRuntime:
    """Mimics sglpy.runtime.engine.Engine.generate's contract with char tokens."""

    def __init__(self, answer="ok", abort=None):
        self.tokenizer, self.answer, self.abort_msg, self.calls = StubTokenizer(), answer, abort, []

    def _one(self, ids, sp, return_logprob=False, logprob_start_len=None, **_):
        reason = {"type": "abort", "message": self.abort_msg} if self.abort_msg else {"type": "length", "length": 1}
        meta = {"prompt_tokens": len(ids), "completion_tokens": 1, "cached_tokens": 0, "finish_reason": reason}
        if return_logprob:
            start = len(ids) - 1 if logprob_start_len in (None, -1) else logprob_start_len
            # SGLang's rule: entries from the start position on, the first one without a logprob
            meta["input_token_logprobs"] = [[None if i == start else -float(t % 7), t, chr(t)]
                                            for i, t in enumerate(ids) if i >= start]
        prefill_only = SamplingParams.from_dict(sp).max_new_tokens == 0  # the real engine takes both forms
        return {"text": "" if prefill_only else self.answer, "output_ids": [], "meta_info": meta}

    def generate(self, prompt=None, sampling_params=None, input_ids=None, stream=False, **kw):
        self.calls.append(dict(prompt=prompt, sampling_params=sampling_params, input_ids=input_ids, stream=stream, **kw))
        if stream:
            return iter([{"text": self.answer[:k], "meta_info": {}} for k in range(1, len(self.answer) + 1)])
        items = input_ids if input_ids is not None else prompt
        if isinstance(items, list) and items and isinstance(items[0], (list, str)):
            return [self._one(x if isinstance(x, list) else self.tokenizer.encode(x), sampling_params, **kw)
                    for x in items]
        ids = items if isinstance(items, list) else self.tokenizer.encode(items)
        n = SamplingParams.from_dict(sampling_params).n
        return self._one(ids, sampling_params, **kw) if n == 1 else [self._one(ids, sampling_params, **kw)] * n

    def shutdown(self):
        self.calls.append("shutdown")


def test_gen_calls_engine_generate_with_sglang_sampling_params():
    rt = StubRuntime()
    eng = Engine(engine=rt)
    assert eng.get_chat_template().name == "chatml"

    @sgl.function
    def prog(s):
        s += "Hi" + sgl.gen("a", max_tokens=3, return_logprob=True) + sgl.gen("b", n=2)

    st = prog.run(backend=eng, temperature=0)
    assert st["b"] == ["ok", "ok"]
    first, second = rt.calls
    assert first["prompt"] == "Hi" and first["return_logprob"] is True
    assert first["sampling_params"].max_new_tokens == 3 and first["sampling_params"].n == 1
    assert second["sampling_params"].n == 2  # n passes through: the runtime draws the samples
    assert second["prompt"] == "Hiok"


def test_select_prefills_prefix_then_scores_choice_windows():
    rt = StubRuntime()
    eng = Engine(engine=rt)

    @sgl.function
    def prog(s):
        s += "Q? " + sgl.select("x", ["ab", "c"], choices_method=sgl.unconditional_likelihood_normalized)

    st = prog.run(backend=eng)
    assert st["x"] in ("ab", "c")
    prefill, batch, uncond = rt.calls
    assert prefill["input_ids"] == [ord(c) for c in "Q? "] and prefill["sampling_params"] == {"max_new_tokens": 0}
    assert batch["input_ids"] == [[ord(c) for c in "Q? ab"], [ord(c) for c in "Q? c"]]
    assert batch["logprob_start_len"] == 3 and batch["return_text_in_logprobs"] is True  # the window start
    assert uncond["input_ids"] == [[ord("a"), ord("b")], [ord("c")]] and uncond["logprob_start_len"] == 0
    windows = st.get_meta_info("x")["input_token_logprobs"]
    assert [[e[2] for e in w] for w in windows] == [["a", "b"], ["c"]]


def test_stream_deltas_and_abort_errors():
    eng = Engine(engine=StubRuntime(answer="hello"))

    @sgl.function
    def prog(s):
        s += "Say:" + sgl.gen("a")

    st = prog.run(backend=eng, stream=True)
    assert list(st.text_iter("a")) and st["a"] == "hello"
    aborting = Engine(engine=StubRuntime(abort="out of memory"))
    with pytest.warns(RuntimeWarning):
        st = prog.run(backend=aborting)
        with pytest.raises(sgl.ProgramError, match="aborted the request: out of memory"):
            st["a"]


def test_offline_engine_calls_pass_through():
    rt = StubRuntime()
    with Engine(engine=rt) as eng:
        out = eng.generate(prompt="Hi", sampling_params={"max_new_tokens": 2})
        assert out["text"] == "ok"
        outs = eng.generate(["a", "b"], {"max_new_tokens": 1})
        assert [o["text"] for o in outs] == ["ok", "ok"]
        assert eng.tokenizer is rt.tokenizer
    assert rt.calls[-1] == "shutdown"
    with pytest.raises(ValueError, match="together with an engine"):
        Engine(engine=rt, max_running_requests=4)


@pytest.mark.timeout(300)
def test_gen_stop_regex_on_the_in_process_engine(tiny_model_path):
    """sgl.gen(stop_regex=...) reaches the runtime engine, which cuts the text at the first match."""
    import re

    eng = Engine(tiny_model_path, max_total_tokens=2048)
    try:
        @sgl.function
        def prog(s, pattern):
            s += "Some text:" + sgl.gen("x", max_tokens=20, ignore_eos=True, stop_regex=pattern)

        full = prog.run(backend=eng, temperature=0, pattern=None)["x"]
        i = len(full) // 2
        pattern = "(?s)" + re.escape(full[i]) + "." + re.escape(full[i + 2])
        st = prog.run(backend=eng, temperature=0, pattern=pattern)
        assert st["x"] == full[: re.search(pattern, full).start()]
        assert st.get_meta_info("x")["finish_reason"] == {"type": "stop", "matched": pattern}
    finally:
        eng.shutdown()


@pytest.mark.timeout(300)
def test_select_scores_are_exactly_the_choice_tokens_logprobs(tiny_model_path):
    """Each choice's window holds the logprob of each of its own tokens given everything before it (the
    conditional log-likelihood), for every method, whatever start position the backend asks the runtime for."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    eng = Engine(tiny_model_path, max_total_tokens=2048, quantization="none")  # float32: equal to HF's
    try:
        prefix, choices = "Is the sky blue? Answer:", [" yes", " no", " maybe not"]
        for method in (sgl.token_length_normalized, sgl.greedy_token_selection,
                       sgl.unconditional_likelihood_normalized):
            @sgl.function
            def prog(s):
                s += prefix + sgl.select("a", choices, choices_method=method)

            meta = prog.run(backend=eng).get_meta_info("a")
            for c, window, norm in zip(choices, meta["input_token_logprobs"], meta["normalized_prompt_logprobs"]):
                ids = eng.tokenize(prefix + c)
                start = len(ids) - len(window)
                assert [e[1] for e in window] == ids[start:] and start >= 1
                with torch.no_grad():
                    ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
                expected = [ref[p - 1, ids[p]].item() for p in range(start, len(ids))]
                assert [e[0] for e in window] == pytest.approx(expected, abs=1e-4)
                assert norm == pytest.approx(sum(expected) / len(expected), abs=1e-4)
    finally:
        eng.shutdown()
