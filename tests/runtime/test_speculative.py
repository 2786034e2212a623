"""Speculative decoding (NGRAM) on a tiny model: greedy outputs equal without it, drafts verified and rolled back
with no leaked KV, constraints / stops / logprobs / abort unchanged, refused settings named."""

import os

import pytest

from sglpy.runtime.core import BatchEntry, Req
from sglpy.runtime.engine import Engine
from sglpy.runtime.engine.spec.ngram import NgramDrafter, SpecState, min_rate
from sglpy.runtime.model.forward_batch import build_host_batch
from sglpy.runtime.sampling_params import SamplingParams

PROMPTS = ["The cat sat on the mat. The cat sat on the mat. The dog ran in the park. The cat sat on the",
           "hello hello hello hello",
           "1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2",
           "Alice met Bob. Bob met Carol. Carol met Alice. Alice met"]


class OracleDrafter(NgramDrafter):
    """Drafts the reference continuation (corrupted at every `wrong`-th token): exercises accept, partial accept
    and full rejection with known answers, at any batch size."""

    def __init__(self, reference: dict[tuple, list[int]], k: int = 4, wrong: int = 0):
        super().__init__(k, 1, 4, set())
        self.reference, self.k, self.wrong, self.calls = reference, k, wrong, 0

    def budget(self, batch_size):
        return 1 << 20

    def propose(self, req, limit):
        if req.spec is None:
            req.spec = SpecState(self.k)
        ref = self.reference[tuple(req.input_ids)]
        n = len(req.output_ids)
        draft = list(ref[n:n + min(self.k, limit)])
        self.calls += 1
        if self.wrong and draft and self.calls % self.wrong == 0:
            draft[len(draft) // 2] = (draft[len(draft) // 2] + 1) % 1000
        return tuple(draft)


@pytest.fixture(scope="module")
def engines(tiny_model_path):
    kw = dict(max_total_tokens=3000, max_running_requests=16, debug_invariants=True, seed=3, quantization="none")
    base = Engine(tiny_model_path, **kw)
    spec = Engine(tiny_model_path, speculative_algorithm="NGRAM", **kw)
    yield base, spec
    base.shutdown()
    spec.shutdown()


def _no_leak(eng):
    info = eng.get_server_info()
    assert info["kv_used"] == 0 and info["num_running_reqs"] == 0, info
    assert info["kv_free"] + info["kv_evictable"] == info["max_total_num_tokens"]


def _strip(out):
    if isinstance(out, list):
        return [_strip(o) for o in out]
    meta = {k: v for k, v in out["meta_info"].items()
            if k not in ("id", "ttft", "cached_tokens", "spec_verify_ct") and "latency" not in k}
    for key in ("input_token_logprobs", "output_token_logprobs", "input_top_logprobs", "output_top_logprobs"):
        meta.pop(key, None)  # compared approximately
    return {"text": out["text"], "output_ids": out["output_ids"], "meta": meta}


def _lps(out):
    vals = []
    for o in out if isinstance(out, list) else [out]:
        for key in ("output_token_logprobs",):
            vals += [e[0] if e[0] is not None else 0.0 for e in o["meta_info"].get(key) or []]
        for tops in o["meta_info"].get("output_top_logprobs") or []:
            vals += [e[0] for e in tops or []]
    return vals


def _accepted(eng):
    return eng.get_server_info()["spec_accepted_tokens"]


def test_greedy_equal_and_drafts_accepted(engines):
    base, spec = engines
    sp = {"max_new_tokens": 48, "temperature": 0}
    before = _accepted(spec)
    ref = base.generate(prompt=PROMPTS, sampling_params=sp)
    got = spec.generate(prompt=PROMPTS, sampling_params=sp)
    assert _strip(got) == _strip(ref)
    assert _accepted(spec) > before + 20  # the drafts were used, not only proposed
    assert any(o["meta_info"]["spec_verify_ct"] > 0 for o in got)
    _no_leak(base)
    _no_leak(spec)


@pytest.mark.parametrize("wrong", [0, 1, 3])
def test_oracle_drafts_accepted_rejected_and_rolled_back(engines, wrong):
    """Whole accepts (wrong=0), a bad token in every draft (1) or every third (3): same tokens, no leaked KV."""
    base, spec = engines
    sp = {"max_new_tokens": 24, "temperature": 0}
    ref = base.generate(prompt=PROMPTS, sampling_params=sp)
    ids = [base.tokenizer(p).input_ids for p in PROMPTS]
    drafter = spec.loop.stepper.drafter
    oracle = OracleDrafter({tuple(i): r["output_ids"] for i, r in zip(ids, ref)}, wrong=wrong)
    spec.loop.stepper.drafter = oracle
    try:
        got = spec.generate(input_ids=ids, sampling_params=sp)
    finally:
        spec.loop.stepper.drafter = drafter
    assert [g["output_ids"] for g in got] == [r["output_ids"] for r in ref]
    st = oracle.stats
    assert st["spec_draft_tokens"] > 0
    if wrong == 0:  # every draft right: far fewer verify forwards than tokens
        assert st["spec_accepted_tokens"] == st["spec_draft_tokens"]
        assert max(g["meta_info"]["spec_verify_ct"] for g in got) <= 24 // 5 + 1
    else:
        assert st["spec_accepted_tokens"] < st["spec_draft_tokens"]
    _no_leak(spec)


def test_stops_lengths_logprobs_equal(engines):
    base, spec = engines
    cases = [
        {"max_new_tokens": 30, "temperature": 0, "stop": [" mat"]},
        {"max_new_tokens": 7, "temperature": 0},
        {"max_new_tokens": 20, "temperature": 0, "min_new_tokens": 15, "stop_token_ids": [32199, 11500]},
        {"max_new_tokens": 20, "temperature": 0, "stop_token_ids": [32199]},
    ]
    for sp in cases:
        ref = base.generate(prompt=PROMPTS, sampling_params=sp, return_logprob=True, top_logprobs_num=3)
        got = spec.generate(prompt=PROMPTS, sampling_params=sp, return_logprob=True, top_logprobs_num=3)
        assert _strip(got) == _strip(ref), sp
        assert _lps(got) == pytest.approx(_lps(ref), abs=1e-4)
    _no_leak(spec)


def test_constrained_equal(engines):
    base, spec = engines
    for sp in ({"max_new_tokens": 40, "temperature": 0, "regex": r"(ab|cd){2,6}(ab|cd|ef)*"},
               {"max_new_tokens": 40, "temperature": 0, "regex": r"\[(1, ){0,9}2\]"},
               {"max_new_tokens": 60, "temperature": 0, "json_schema": '{"type": "object", "properties": '
                '{"a": {"type": "string", "maxLength": 12}, "b": {"type": "integer"}}, "required": ["a", "b"]}'}):
        ref = base.generate(prompt=PROMPTS, sampling_params=sp)
        got = spec.generate(prompt=PROMPTS, sampling_params=sp)
        assert _strip(got) == _strip(ref), sp
    _no_leak(spec)


def test_seeded_sampling_reproducible_and_equal(engines):
    base, spec = engines
    sp = {"max_new_tokens": 24, "temperature": 0.8, "top_k": 5, "seed": 11}
    ref = base.generate(prompt=PROMPTS, sampling_params=sp)
    a = spec.generate(prompt=PROMPTS, sampling_params=sp)
    b = spec.generate(prompt=PROMPTS, sampling_params=sp)
    assert [x["output_ids"] for x in a] == [x["output_ids"] for x in b]
    # one uniform per token from the request's own generator, as without speculation
    assert [x["output_ids"] for x in a] == [x["output_ids"] for x in ref]
    _no_leak(spec)


def test_abort_mid_generation_frees_kv(engines):
    _, spec = engines
    import threading

    rid = "spec-abort"
    t = threading.Timer(0.05, lambda: spec.abort(rid))
    t.start()
    out = spec.generate(prompt=PROMPTS[1] * 4, sampling_params={"max_new_tokens": 400, "temperature": 0,
                                                                  "ignore_eos": True}, rid=rid)
    t.join()
    assert out["meta_info"]["finish_reason"]["type"] in ("abort", "length")
    _no_leak(spec)


@pytest.mark.skipif(os.environ.get("SGLPY_DISABLE_CPU_KERNELS") == "1",
                    reason="deterministic inference needs the native CPU kernels (refused without them)")
def test_quantized_deterministic_greedy_equal(tiny_model_path):
    """int8 under enable_deterministic_inference: a row's result does not depend on the rows beside it, so the
    verify rows give the tokens plain decode steps give (without it, int8/int4 near-ties may differ, as batching)."""
    sp = {"max_new_tokens": 40, "temperature": 0}
    outs = []
    for kw in ({}, {"speculative_algorithm": "NGRAM"}):
        eng = Engine(tiny_model_path, device="cpu", max_total_tokens=3000, quantization="int8",
                     enable_deterministic_inference=True, debug_invariants=True, **kw)  # int8: a CPU mode
        try:
            outs.append([o["output_ids"] for o in eng.generate(prompt=PROMPTS, sampling_params=sp)])
            if kw:
                assert eng.get_server_info()["spec_accepted_tokens"] > 0
        finally:
            eng.shutdown()
    assert outs[0] == outs[1]


def test_refused_settings_named(tiny_model_path):
    with pytest.raises(ValueError, match="speculative_draft_model_path"):
        Engine(tiny_model_path, speculative_algorithm="STANDALONE", quantization="none")
    with pytest.raises(ValueError, match="disable_overlap_schedule"):
        Engine(tiny_model_path, speculative_algorithm="NGRAM", disable_overlap_schedule=False, quantization="none")


# ---------------------------------------------------------------- units: the drafter and the host batch
def _req(ids, out=(), **sampling):
    r = Req("r", list(ids), SamplingParams(**{"max_new_tokens": 64, **sampling}))
    r.output_ids = list(out)
    return r


def test_drafter_matches_longest_recent_suffix():
    d = NgramDrafter(4, 1, 8, eos_ids={2})
    # "4 5 6 7" (older) is longer than "6 7" (more recent): the longest match wins
    assert d.propose(_req([4, 5, 6, 7, 8, 9, 1, 6, 7, 2, 4, 5, 6, 7]), 10) == (8, 9, 1, 6)
    assert d.propose(_req([5, 6, 9, 2, 4, 5, 6]), 10) == (9,)  # cut before EOS (2): the draft never guesses the end
    assert d.propose(_req([3, 4, 2, 7, 3, 4]), 10) == ()
    assert d.propose(_req([5, 6, 9, 5, 6], stop_token_ids=[9]), 10) == ()  # nor a stop token
    assert d.propose(_req([1, 1, 1]), 3) == (1, 1, 1)  # a repetition continues past the end
    assert d.propose(_req([5, 6, 7, 5, 6]), 1) == (7,)  # the limit (max_new_tokens, context) caps it
    assert NgramDrafter(4, 3, 8, set()).propose(_req([5, 6, 7, 1, 6, 7]), 4) == ()  # below min window


def test_drafter_adapts_and_pauses():
    d = NgramDrafter(4, 1, 8, set())
    r = _req([1, 2, 3, 4, 5, 6, 1, 2])
    assert len(d.propose(r, 10)) == 4
    d.record(r, 4, 1)
    assert r.spec.k == 2
    d.record(r, 2, 0)  # nothing accepted: a pause, then one token
    assert r.spec.pause == 1 and r.spec.k == 1
    assert d.propose(r, 10) == ()
    assert len(d.propose(r, 10)) == 1
    d.record(r, 1, 1)
    assert r.spec.k == 2 and r.spec.misses == 0
    assert d.budget(4) == 12 and d.budget(5) == 0  # NGRAM drafts for 4 decoding requests at most



def test_drafter_batch_gate_by_acceptance():
    """In a batch a request drafts only while its recent acceptance pays for a row; alone it always may."""
    assert min_rate(1) == 0.0 and 0 < min_rate(2) < min_rate(4) < min_rate(8) < 1
    d = NgramDrafter(4, 1, 8, set())
    good, bad = _req([1, 2, 3, 4, 5, 6, 1, 2]), _req([7, 8, 9, 10, 11, 7, 8])
    first = d.propose_batch([good, bad], [10, 10], 14)
    assert len(first[0]) == 4 and len(first[1]) == 4  # hopeful start: both draft
    d.record(good, 4, 4)
    d.record(bad, 4, 0)
    bad.spec.pause = 0
    assert good.spec.rate == 1.0 and bad.spec.rate == 0.5 < min_rate(4)
    quiet = d.propose_batch([good, bad, _req([3]), _req([3])], [10] * 4, 12)
    assert len(quiet[0]) == 4 and quiet[1] == ()  # held back in a batch of 4, not alone
    steps = 1
    while not d.propose_batch([good, bad, _req([3]), _req([3])], [10] * 4, 12)[1]:
        steps += 1  # regains a little each held-back step, then probes
    assert 5 < steps < 40
    bad.spec.rate = 0.0
    assert d.propose_batch([bad], [10], 15)[0]  # alone: only the pause rule applies


def test_drafter_cut_by_grammar():
    class Guide:  # accepts only even tokens
        def advance(self, state, t):
            if t % 2:
                raise ValueError("forbidden")
            return state + 1

    class G:
        guide, state = Guide(), 0

    r = _req([4, 6, 8, 3, 10, 4, 6])
    r.grammar = G()
    assert NgramDrafter(4, 1, 8, set()).propose(r, 10) == (8,)  # 8 then 3: cut before 3


def test_host_batch_drafted_entry_is_decode_rows():
    r = _req([10, 11, 12], out=[13])
    r.row, r.slots = 2, [100, 101, 102, 103, 104, 105]  # 4 tokens + 2 draft slots
    d = _req([20, 21], out=[22])
    d.row, d.slots = 3, [200, 201, 202]
    e = _req([30, 31, 32, 33])
    e.row, e.slots = 4, [300, 301, 302, 303]
    entries = [BatchEntry(d, 2, 1, True), BatchEntry(r, 3, 3, True, draft=(14, 15)), BatchEntry(e, 0, 4, True)]
    hb = build_host_batch(entries, 1)
    assert hb.num_decode == 4  # d, then r's three rows; e extends
    assert hb.input_ids == [22, 13, 14, 15, 30, 31, 32, 33]
    assert hb.positions == [2, 3, 4, 5, 0, 1, 2, 3]
    assert hb.out_cache_loc == [202, 103, 104, 105, 300, 301, 302, 303]
    assert hb.req_rows == [3, 2, 2, 2, 4] and hb.prefix_lens == [2, 3, 4, 5, 0] and hb.extend_lens == [1, 1, 1, 1, 4]
    assert hb.sample_row == [0, 1, 4] and hb.logits_rows == [0, 1, 2, 3, 7]
    with pytest.raises(ValueError, match="drafted entry"):
        build_host_batch([entries[2], entries[1]], 0)


@pytest.mark.slow
def test_default_model_extraction_greedy_equal(default_model_path):
    """The default model copying a span of its prompt: same tokens with NGRAM as without, far fewer forwards than
    tokens. Float32, as the other greedy comparisons across batch shapes: int8/int4 outputs depend on the rows a
    step runs (README, docs/determinism.md), and a verify step runs more rows than a decode step."""
    doc = ("## Maintenance\nClean the solar panel and the rain funnel every three months with a soft cloth and fresh "
           "water. Do not use detergents, which damage the coating of the funnel. Replace the backup battery every "
           "two years.\n\n## Warranty\nThe station is covered by a limited warranty of three years from the date of "
           "purchase. To make a claim, contact the retailer with your receipt and the serial number.")
    eng = Engine(default_model_path, speculative_algorithm="NGRAM", debug_invariants=True, quantization="none")
    try:
        prompt = eng.tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Here is a manual:\n\n{doc}\n\nQuote the Warranty section exactly."}],
            tokenize=False, add_generation_prompt=True)
        sp = {"max_new_tokens": 48, "temperature": 0}
        got = eng.generate(prompt=prompt, sampling_params=sp)
        drafter, eng.loop.stepper.drafter = eng.loop.stepper.drafter, None
        try:
            ref = eng.generate(prompt=prompt, sampling_params=sp)
        finally:
            eng.loop.stepper.drafter = drafter
        assert got["output_ids"] == ref["output_ids"]
        assert got["meta_info"]["spec_verify_ct"] < got["meta_info"]["completion_tokens"] // 2
        _no_leak(eng)
    finally:
        eng.shutdown()
