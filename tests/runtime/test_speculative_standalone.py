"""Speculative decoding with a draft model (STANDALONE) on tiny models sharing a tokenizer: greedy outputs equal
without it (plain, constrained, stops, logprobs), sampled outputs distributed as the target's (chi-square), both
KV pools free after finish and abort, refused settings named."""

import math
import threading

import pytest

from sglpy.runtime.config import EngineConfig
from sglpy.runtime.engine import Engine
from sglpy.runtime.engine.spec.probs import judge, processed_probs
from sglpy.runtime.testing import make_tiny_model

PROMPTS = ["The cat sat on the mat. The cat sat on the mat. The dog ran in the park. The cat sat on the",
           "hello hello hello hello",
           "1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2",
           "Alice met Bob. Bob met Carol. Carol met Alice. Alice met"]

KW = dict(max_total_tokens=3000, max_running_requests=16, debug_invariants=True, seed=3, quantization="none")


@pytest.fixture(scope="module")
def draft_path(tmp_path_factory):
    """Another random model with the same tokenizer: its guesses are mostly wrong (rejections, residual draws)."""
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-draft", seed=7, num_layers=1)


@pytest.fixture(scope="module")
def engines(tiny_model_path):
    # the target's own weights in int4 draft for it in float32: most guesses right, some wrong
    base = Engine(tiny_model_path, **KW)
    spec = Engine(tiny_model_path, speculative_algorithm="STANDALONE", speculative_draft_model_path=tiny_model_path,
                  speculative_draft_model_quantization="int4", **KW)
    spec.loop.stepper.drafter.gate = None  # always draft: the tiny draft costs what the target does (gate tested apart)
    yield base, spec
    base.shutdown()
    spec.shutdown()


def _strip(outs):
    """Outputs without timings and counters that differ with speculation (logprobs compared apart)."""
    drop = ("id", "ttft", "cached_tokens", "spec_verify_ct", "input_token_logprobs", "output_token_logprobs",
            "input_top_logprobs", "output_top_logprobs")
    return [{"text": o["text"], "output_ids": o["output_ids"],
             "meta": {k: v for k, v in o["meta_info"].items() if k not in drop and "latency" not in k}} for o in outs]


def _lps(outs):
    vals = []
    for o in outs:
        vals += [e[0] if e[0] is not None else 0.0 for e in o["meta_info"].get("output_token_logprobs") or []]
        for tops in o["meta_info"].get("output_top_logprobs") or []:
            vals += [e[0] for e in tops or []]
    return vals


def _no_leak(eng):
    info = eng.get_server_info()
    assert info["kv_used"] == 0 and info["num_running_reqs"] == 0, info
    assert info["draft_kv_used"] == 0, info  # the draft model's pool: every shadow released
    assert info["draft_kv_free"] + info["draft_kv_evictable"] == info["draft_kv_total"]


def test_greedy_equal_with_accepts_and_rejections(engines):
    base, spec = engines
    sp = {"max_new_tokens": 40, "temperature": 0}
    before = spec.get_server_info()
    ref = base.generate(prompt=PROMPTS, sampling_params=sp)
    got = spec.generate(prompt=PROMPTS, sampling_params=sp)
    assert _strip(got) == _strip(ref)
    info = spec.get_server_info()
    drafted = info["spec_draft_tokens"] - before["spec_draft_tokens"]
    accepted = info["spec_accepted_tokens"] - before["spec_accepted_tokens"]
    assert 20 < accepted < drafted  # the draft model's guesses were used, and some were rolled back
    assert info["spec_draft_forwards"] > before["spec_draft_forwards"]
    assert info["draft_quantization"] == "int4"
    _no_leak(spec)


def test_target_as_its_own_draft_is_accepted_whole(tiny_model_path):
    """The target drafting for itself (float32 both): every greedy draft token is accepted, so the draft KV kept,
    rolled back and extended across steps (and the short extends run as decode rows) is the target's."""
    eng = Engine(tiny_model_path, speculative_algorithm="STANDALONE", speculative_draft_model_path=tiny_model_path,
                 speculative_draft_model_quantization="none", speculative_num_steps=3, **KW)
    eng.loop.stepper.drafter.gate = None
    try:
        eng.generate(prompt=PROMPTS, sampling_params={"max_new_tokens": 40, "temperature": 0, "ignore_eos": True})
        info = eng.get_server_info()
        assert info["spec_draft_tokens"] > 60 and info["spec_accepted_tokens"] == info["spec_draft_tokens"], info
        _no_leak(eng)
    finally:
        eng.shutdown()


def test_stops_logprobs_constrained_equal(engines):
    base, spec = engines
    cases = [
        {"max_new_tokens": 30, "temperature": 0, "stop": [" mat"]},
        {"max_new_tokens": 20, "temperature": 0, "min_new_tokens": 15, "stop_token_ids": [32199, 11500]},
        {"max_new_tokens": 40, "temperature": 0, "regex": r"(ab|cd){2,6}(ab|cd|ef)*"},
        {"max_new_tokens": 60, "temperature": 0, "json_schema": '{"type": "object", "properties": '
         '{"a": {"type": "string", "maxLength": 12}, "b": {"type": "integer"}}, "required": ["a", "b"]}'},
    ]
    for sp in cases:
        ref = base.generate(prompt=PROMPTS, sampling_params=sp, return_logprob=True, top_logprobs_num=3)
        got = spec.generate(prompt=PROMPTS, sampling_params=sp, return_logprob=True, top_logprobs_num=3)
        assert _strip(got) == _strip(ref), sp
        assert _lps(got) == pytest.approx(_lps(ref), abs=1e-4)
    _no_leak(spec)


def test_seeded_sampling_reproducible(engines):
    _, spec = engines
    sp = {"max_new_tokens": 24, "temperature": 0.8, "top_k": 5, "seed": 11}
    # the same engine state both times (caches flushed): a draft computed from cached KV can differ in the last
    # bits from one computed fresh, and a sampled draft follows its q
    assert spec.flush_cache()
    a = spec.generate(prompt=PROMPTS, sampling_params=sp, return_logprob=True, top_logprobs_num=2)
    assert spec.flush_cache()
    b = spec.generate(prompt=PROMPTS, sampling_params=sp, return_logprob=True, top_logprobs_num=2)
    assert [x["output_ids"] for x in a] == [x["output_ids"] for x in b]
    assert _lps(a) == pytest.approx(_lps(b), abs=1e-5)
    for o in a:  # judged tokens carry the target's logprob records, one per token
        lps = o["meta_info"]["output_token_logprobs"]
        assert [e[1] for e in lps] == o["output_ids"] and all(e[0] <= 0 for e in lps)
        assert all(len(t) == 2 for t in o["meta_info"]["output_top_logprobs"])
    _no_leak(spec)


def test_abort_mid_generation_frees_both_pools(engines):
    _, spec = engines
    rid = "standalone-abort"
    t = threading.Timer(0.05, lambda: spec.abort(rid))
    t.start()
    out = spec.generate(prompt=PROMPTS[1] * 4, sampling_params={"max_new_tokens": 400, "temperature": 0,
                                                                  "ignore_eos": True}, rid=rid)
    t.join()
    assert out["meta_info"]["finish_reason"]["type"] in ("abort", "length")
    _no_leak(spec)
    assert spec.flush_cache()
    assert spec.get_server_info()["draft_kv_free"] == spec.get_server_info()["draft_kv_total"]


N = 300
TOP_K = 3
CHI2_DF8 = 31.83  # chi-square critical value, 8 degrees of freedom, p = 0.0001


def _top(eng, ids):
    """The target's top-k next tokens after ids, renormalised over them (what top_k sampling draws from)."""
    out = eng.generate(input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0},
                       return_logprob=True, top_logprobs_num=TOP_K)
    tops = out["meta_info"]["output_top_logprobs"][0]
    z = sum(math.exp(lp) for lp, _, _ in tops)
    return {t: math.exp(lp) / z for lp, t, _ in tops}


@pytest.mark.parametrize("near", [True, False])
def test_rejection_sampling_with_draft_model_matches_target(tiny_model_path, draft_path, near):
    """The target's int4 weights (q near p) or another model (q far from p: its top-3 rarely meets the target's)
    draft: the 2nd and 3rd tokens, verified by the p/q scheme, are distributed as the target's own (chi-square
    over the 9 pairs of its top-3 sampling, given its likeliest 1st token)."""
    draft = dict(speculative_draft_model_path=tiny_model_path, speculative_draft_model_quantization="int4") if near \
        else dict(speculative_draft_model_path=draft_path)
    eng = Engine(tiny_model_path, max_total_tokens=12000, max_running_requests=128, debug_invariants=True, seed=5,
                 quantization="none", speculative_algorithm="STANDALONE", speculative_num_steps=2, **draft)
    try:
        ids = eng.tokenizer("Once upon a time, in a land far").input_ids
        p0 = _top(eng, ids)
        g = max(p0, key=p0.get)
        exact = {}
        for t1, q1 in _top(eng, ids + [g]).items():
            for t2, q2 in _top(eng, ids + [g, t1]).items():
                exact[(t1, t2)] = q1 * q2
        drafter = eng.loop.stepper.drafter
        drafter.budget = lambda batch_size: 1 << 20  # every request drafts, at any batch size
        drafter.gate = None
        before = eng.get_server_info()
        outs = eng.generate(input_ids=[ids] * N, sampling_params={"max_new_tokens": 4, "temperature": 1.0,
                                                                   "top_k": TOP_K})
        info = eng.get_server_info()
        drafted = info["spec_draft_tokens"] - before["spec_draft_tokens"]
        accepted = info["spec_accepted_tokens"] - before["spec_accepted_tokens"]
        assert drafted >= N and accepted < drafted  # rejections happened (residual draws)
        assert accepted > drafted // 2 if near else True  # and, near, acceptance
        counts, n = {}, 0
        for o in outs:
            if o["output_ids"][0] == g:
                key = tuple(o["output_ids"][1:3])
                counts[key] = counts.get(key, 0) + 1
                n += 1
        assert n > N // 5 and set(counts) <= set(exact), (counts, exact)
        chi2 = sum((counts.get(k, 0) - n * q) ** 2 / (n * q) for k, q in exact.items())
        assert chi2 < CHI2_DF8, (chi2, n, counts, exact)
        assert info["kv_used"] == 0 and info["draft_kv_used"] == 0
    finally:
        eng.shutdown()


class _Clock:
    t = 0.0

    def __call__(self):
        return self.t


def _run_gate(gate, clock, draft_s, plain_s, steps=200, reqs=None):
    """A one-request decode under the gate: a drafting step gains 4 tokens in draft_s, a plain one 1 in plain_s."""
    reqs, tokens, drafted = reqs or [object()], 0, 0
    for _ in range(steps):
        d = gate.decide(reqs, tokens)
        drafted += d
        clock.t += draft_s if d else plain_s
        tokens += 4 if d else 1
    return drafted


def test_cost_gate_drafts_only_where_drafting_is_faster():
    from sglpy.runtime.engine.spec.gate import CostGate

    c = _Clock()
    g = CostGate(clock=c)
    assert _run_gate(g, c, draft_s=1.0, plain_s=0.5) > 180  # 4 tok/s vs 2: drafts, probing plain now and then
    assert g.rate[True] == pytest.approx(4.0) and g.rate[False] == pytest.approx(2.0)
    c = _Clock()
    g = CostGate(clock=c)
    assert _run_gate(g, c, draft_s=3.0, plain_s=0.5) < 20  # 1.3 tok/s vs 2: plain steps, probing drafts
    assert g.stats["spec_gate_off_steps"] > 180 and g.stats["spec_gate_probes"] > 0
    # a decision that holds is probed less and less often; a change of costs turns it over within a few steps
    c = _Clock()
    g = CostGate(clock=c)
    reqs = [object()]
    assert _run_gate(g, c, draft_s=1.0, plain_s=0.5, steps=2000, reqs=reqs) > 1990
    assert g.stats["spec_gate_probes"] <= 7
    assert _run_gate(g, c, draft_s=3.0, plain_s=0.5, steps=500, reqs=reqs) < 30
    c = _Clock()
    g = CostGate(clock=c)
    g.decide(reqs, 0)
    c.t += 100.0  # the decoding requests changed in between (a new one, an idle gap): no sample
    g.decide([object()], 1)
    assert g.rate[True] is None


def test_judge_is_exact_on_a_tiny_vocabulary():
    """The p/q step on a 4-token vocabulary: the emitted token is distributed as p (expectation, no sampling)."""
    import torch

    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.1, 0.6, 0.0, 0.3])
    emitted = torch.zeros(4)
    # uniforms on grids that hold the acceptance ratio (1/2) and the residual's cut (2/3) exactly: an expectation
    grid, grid2 = [(i + 0.5) / 50 for i in range(50)], [(i + 0.5) / 30 for i in range(30)]
    for d in range(4):
        for u in grid:
            for u2 in grid2:
                emitted[judge(p, q, d, u, lambda: u2).token] += float(q[d]) / (len(grid) * len(grid2))
    assert torch.allclose(emitted, p, atol=1e-5), emitted


def test_processed_probs_follows_truncation():
    import torch

    from sglpy.runtime.core import Req
    from sglpy.runtime.sampling_params import SamplingParams

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, float("-inf")]])
    r = Req("r", [1], SamplingParams(max_new_tokens=4, temperature=1.0, top_k=3))
    p = processed_probs(logits, [r])[0]
    e = torch.exp(torch.tensor([2.0, 1.0, 0.0]))
    assert torch.allclose(p[:3], e / e.sum()) and p[3:].sum() == 0
    r = Req("r", [1], SamplingParams(max_new_tokens=4, temperature=1.0, top_p=0.5))
    assert processed_probs(logits, [r])[0].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_refused_settings_named(tiny_model_path, tmp_path):
    with pytest.raises(ValueError, match="speculative_draft_model_path"):
        EngineConfig(speculative_algorithm="STANDALONE")
    with pytest.raises(ValueError, match="speculative_num_steps"):
        EngineConfig(speculative_algorithm="NGRAM", speculative_num_steps=3)
    with pytest.raises(ValueError, match="speculative_draft_model_quantization"):
        EngineConfig(speculative_algorithm="STANDALONE", speculative_draft_model_path="x",
                     speculative_draft_model_quantization="int3")
    with pytest.raises(ValueError, match="does not exist"):
        Engine(tiny_model_path, speculative_algorithm="STANDALONE",
               speculative_draft_model_path=str(tmp_path / "no-such-model"), quantization="none")
    with pytest.raises(ValueError, match="tensor parallelism"):
        Engine(tiny_model_path, speculative_algorithm="STANDALONE", speculative_draft_model_path=tiny_model_path,
               tp_size=2, quantization="none")
    wide = make_tiny_model(tmp_path / "wide-vocab", extra=dict(vocab_size=49160))
    with pytest.raises(ValueError, match="vocab_size 49160 differs"):
        Engine(tiny_model_path, speculative_algorithm="STANDALONE", speculative_draft_model_path=wide,
               quantization="none")


@pytest.mark.slow
def test_default_model_int4_draft_for_float32_target(default_model_path):
    """The default model's own weights in int4 drafting for it in float32: the same greedy tokens as without the
    draft, most drafted tokens accepted, far fewer target forwards than tokens, both pools free."""
    eng = Engine(default_model_path, quantization="none", speculative_algorithm="STANDALONE",
                 speculative_draft_model_path=default_model_path, speculative_draft_model_quantization="int4",
                 debug_invariants=True, max_total_tokens=8192)
    eng.loop.stepper.drafter.gate = None  # the comparison below is about the tokens, not the speed
    try:
        prompt = eng.tokenizer.apply_chat_template([{"role": "user", "content": "Write a short story about a fox."}],
                                                   tokenize=False, add_generation_prompt=True)
        sp = {"max_new_tokens": 48, "temperature": 0}
        got = eng.generate(prompt=prompt, sampling_params=sp)
        drafter, eng.loop.stepper.drafter = eng.loop.stepper.drafter, None
        try:
            ref = eng.generate(prompt=prompt, sampling_params=sp)
        finally:
            eng.loop.stepper.drafter = drafter
        assert got["output_ids"] == ref["output_ids"]
        info = eng.get_server_info()
        assert info["spec_accepted_tokens"] > info["spec_draft_tokens"] // 2
        assert got["meta_info"]["spec_verify_ct"] < got["meta_info"]["completion_tokens"] // 2
        _no_leak(eng)
    finally:
        eng.shutdown()
