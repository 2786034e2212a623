"""Failure isolation in the step loop (tiny model): a fault in one request's phase aborts it alone.

A fault is injected for one rid in each per-request phase (Engine.isolation.hook); its neighbours in the
same batch (greedy, seeded-sampled, with logprobs, stop strings, stop_regex, a constraint) must finish with
exactly the output they have without the fault, and the KV accounting must balance afterwards
(debug_invariants checks it after every step). Real faults that used to abort whole batches (a non-bool
skip_special_tokens reaching the detokenizer, a top_logprobs_num beyond the vocabulary) are checked too.
"""

import dataclasses

import pytest

from sglpy.runtime.engine import Engine
from sglpy.runtime.engine.isolation import PHASES
from sglpy.runtime.messages import GenerateReqInput
from sglpy.runtime.sampling_params import LogprobOptions, SamplingParams

NEIGHBOURS = [
    ("greedy", "The weather today is", {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}, {}),
    ("seeded", "Once upon a time", {"max_new_tokens": 12, "temperature": 0.8, "seed": 5, "ignore_eos": True}, {}),
    ("logprobs", "Numbers: one two", {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True},
     {"return_logprob": True, "top_logprobs_num": 3, "logprob_start_len": 0}),
    ("stops", "A list of words:", {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True,
                                   "stop": ["zzz"], "stop_regex": [r"\d{9}"]}, {}),
    ("regex", "Pick a code:", {"max_new_tokens": 12, "temperature": 0, "regex": r"code-[a-z]{2,6}[0-9]{1,3}"}, {}),
]
CULPRIT = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True, "regex": r"id-[0-9]{2,4}[a-z]{0,5}"}


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    eng = Engine(tiny_model_path, max_total_tokens=4096, debug_invariants=True, seed=3)
    yield eng
    eng.shutdown()


def _run(engine, with_culprit=True):
    prompts, sps, rids = [], [], []
    for name, prompt, sp, _ in NEIGHBOURS:
        prompts.append(prompt)
        sps.append(sp)
        rids.append(name)
    if with_culprit:
        prompts.append("The culprit says")
        sps.append(CULPRIT)
        rids.append("culprit")
    # one generate call per request so each keeps its own logprob options; submitted together, batched together
    import concurrent.futures

    extra = {name: kw for name, _, _, kw in NEIGHBOURS}
    extra["culprit"] = {"return_logprob": True, "top_logprobs_num": 2, "logprob_start_len": 0}
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        futs = {rid: pool.submit(engine.generate, p, sp, rid=rid, **extra[rid]) for p, sp, rid in
                zip(prompts, sps, rids)}
        return {rid: f.result() for rid, f in futs.items()}


def _assert_no_leak(engine):
    info = engine.get_server_info()
    assert info["kv_used"] == 0 and info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0, info
    assert info["kv_free"] + info["kv_evictable"] == info["max_total_num_tokens"]


@pytest.fixture(scope="module")
def baseline(engine):
    out = _run(engine, with_culprit=False)
    for name, o in out.items():
        assert o["meta_info"]["finish_reason"]["type"] != "abort", (name, o)
    return out


def _same(a, b):
    """Same text, tokens and finish; logprobs equal up to float noise (batch composition changes the sums)."""
    assert (a["text"], a["output_ids"]) == (b["text"], b["output_ids"])
    ma, mb = a["meta_info"], b["meta_info"]
    assert ma["finish_reason"] == mb["finish_reason"] and ma["completion_tokens"] == mb["completion_tokens"]
    for key in ("input_token_logprobs", "output_token_logprobs"):
        assert (key in ma) == (key in mb)
        for x, y in zip(ma.get(key, []), mb.get(key, [])):
            assert x[1:] == y[1:] and (x[0] is None) == (y[0] is None)
            assert x[0] is None or x[0] == pytest.approx(y[0], abs=1e-3)


@pytest.mark.parametrize("phase", PHASES)
def test_a_fault_in_one_request_aborts_it_alone(engine, baseline, phase):
    def hook(ph, req):
        if req.rid == "culprit" and ph == phase:
            raise RuntimeError(f"injected fault in {ph}")

    engine.isolation.hook = hook
    try:
        out = _run(engine)
    finally:
        engine.isolation.hook = None
    reason = out["culprit"]["meta_info"]["finish_reason"]
    assert reason["type"] == "abort", reason
    assert f"internal error in {phase}" in reason["message"] and "injected fault" in reason["message"], reason
    for name, _, _, _ in NEIGHBOURS:
        _same(out[name], baseline[name])
    _assert_no_leak(engine)
    assert engine.get_server_info()["isolated_failures"].get(phase, 0) >= 1


def _submit_raw(engine, rid, prompt, sampling: SamplingParams, logprob=LogprobOptions()):
    """Build and run one request whose parameters skipped validation (as if a check were missing)."""
    import concurrent.futures

    from sglpy.runtime.engine.delivery import BatchWaiter

    req = engine.build_request(GenerateReqInput(rid=rid, text=prompt, sampling=SamplingParams(max_new_tokens=1),
                                                logprob=logprob))
    req = dataclasses.replace(req, sampling=sampling)
    waiter = BatchWaiter([rid])
    engine.submit(req, waiter)
    return waiter.futures[rid]


@pytest.mark.parametrize("field,value,words", [
    ("skip_special_tokens", "no", ["detokenize"]),
    ("top_logprobs_num", 1_000_000, ["logprobs"]),
])
def test_unvalidated_values_abort_only_their_request(engine, baseline, field, value, words):
    sp = SamplingParams(max_new_tokens=6, temperature=0, ignore_eos=True)
    logprob = LogprobOptions()
    if field == "top_logprobs_num":
        logprob = dataclasses.replace(LogprobOptions(return_logprob=True), top_logprobs_num=1)
        object.__setattr__(logprob, "top_logprobs_num", value)  # past LogprobOptions' own check
    else:
        object.__setattr__(sp, field, value)
    bad = _submit_raw(engine, "bad", "Bad values here", sp, logprob)
    out = _run(engine, with_culprit=False)
    reason = bad.result(timeout=120)["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and all(w in reason["message"] for w in words), reason
    for name, _, _, _ in NEIGHBOURS:
        _same(out[name], baseline[name])
    _assert_no_leak(engine)


def test_a_catastrophic_stop_regex_ends_its_own_request(tiny_model_path):
    """(x|x)+z backtracks exponentially on a run of x: the search is time-limited, the request ends alone."""
    eng = Engine(tiny_model_path, max_total_tokens=4096, debug_invariants=True, disable_jump_forward=True)
    try:
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            bad = pool.submit(eng.generate, "x", {"max_new_tokens": 80, "temperature": 0, "regex": "x{60,80}",
                                                  "stop_regex": [r"(x|x)+z"]})
            good = [pool.submit(eng.generate, p, sp) for _, p, sp, _ in NEIGHBOURS[:2]]
            reason = bad.result(timeout=300)["meta_info"]["finish_reason"]
            assert reason["type"] == "abort" and "stop_regex" in reason["message"], reason
            for g in good:
                assert g.result(timeout=300)["meta_info"]["finish_reason"]["type"] == "length"
        info = eng.get_server_info()
        assert info["kv_used"] == 0 and info["num_running_reqs"] == 0
    finally:
        eng.shutdown()


def test_a_vocabulary_sized_logit_bias_is_applied_exactly(engine):
    """Built once per request as tensors (a per-step loop over 49k entries cost ~0.5 s per step for the batch)."""
    vocab = engine.limits.vocab_size
    target = 1234
    bias = {t: -50.0 for t in range(vocab)}
    bias[target] = 50.0
    out = engine.generate("Anything", {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True, "logit_bias": bias})
    assert out["output_ids"] == [target] * 5
    small = engine.generate("Anything", {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True,
                                         "logit_bias": {"77": 100.0}})
    assert small["output_ids"] == [77] * 3
