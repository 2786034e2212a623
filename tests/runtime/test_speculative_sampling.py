"""Speculative sampling keeps the output distribution: the 2nd and 3rd tokens of many sampled requests (the 1st comes
from the prefill, undrafted), with a fixed draft verified by the rejection scheme, against the target's exact
distribution (chi-square), given the likeliest 1st token."""

import math

from sglpy.runtime.engine import Engine
from sglpy.runtime.engine.spec.ngram import NgramDrafter, SpecState

N = 400
TOP_K = 3
CHI2_DF8 = 31.83  # chi-square critical value, 8 degrees of freedom, p = 0.0001


class FixedDrafter(NgramDrafter):
    """Always drafts the same two tokens at the first decode step (accepted with the target's probability)."""

    def __init__(self, draft):
        super().__init__(4, 1, 4, set())
        self.draft = tuple(draft)

    def budget(self, batch_size):
        return 1 << 20

    def propose(self, req, limit):
        if req.spec is None:
            req.spec = SpecState(4)
        return self.draft[:limit] if len(req.output_ids) == 1 else ()


def _top(eng, ids):
    """The target's top-k next tokens after ids and their probabilities renormalised over them (top_k sampling)."""
    out = eng.generate(input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0},
                       return_logprob=True, top_logprobs_num=TOP_K)
    tops = out["meta_info"]["output_top_logprobs"][0]
    z = sum(math.exp(lp) for lp, _, _ in tops)
    return {t: math.exp(lp) / z for lp, t, _ in tops}


def _counts(outs, first):
    """Counts of (2nd, 3rd) token among the outputs whose 1st token is `first`, and how many those are."""
    c, n = {}, 0
    for o in outs:
        if o["output_ids"][0] == first:
            key = tuple(o["output_ids"][1:3])
            c[key] = c.get(key, 0) + 1
            n += 1
    return c, n


def test_rejection_sampling_matches_target_distribution(tiny_model_path):
    eng = Engine(tiny_model_path, max_total_tokens=12000, max_running_requests=128, debug_invariants=True, seed=5,
                 quantization="none", speculative_algorithm="NGRAM")
    try:
        ids = eng.tokenizer("Once upon a time, in a land far").input_ids
        p0 = _top(eng, ids)
        g = max(p0, key=p0.get)
        p1 = _top(eng, ids + [g])
        exact = {}
        for t1, q1 in p1.items():
            for t2, q2 in _top(eng, ids + [g, t1]).items():
                exact[(t1, t2)] = q1 * q2
        # draft the second likeliest 2nd token (accepted about p1 of the time) and its likeliest successor
        d1 = sorted(p1, key=p1.get)[-2]
        d2 = max((k for k in exact if k[0] == d1), key=exact.get)[1]
        sp = {"max_new_tokens": 4, "temperature": 1.0, "top_k": TOP_K}
        drafter = eng.loop.stepper.drafter
        fixed = eng.loop.stepper.drafter = FixedDrafter((d1, d2))
        try:
            spec, n = _counts(eng.generate(input_ids=[ids] * N, sampling_params=sp), g)
        finally:
            eng.loop.stepper.drafter = drafter
        assert fixed.stats["spec_draft_tokens"] == 2 * N
        assert 0 < fixed.stats["spec_accepted_tokens"] < 2 * N  # both acceptance and rejection happened
        assert n > N // 5 and set(spec) <= set(exact)
        chi2 = sum((spec.get(k, 0) - n * q) ** 2 / (n * q) for k, q in exact.items())
        assert chi2 < CHI2_DF8, (chi2, n, spec, exact)
        # the draft was accepted about as often as the target samples it (the rejection scheme's acceptance)
        accepted = sum(c for k, c in spec.items() if k[0] == d1)
        assert abs(accepted / n - p1[d1]) < 4 * math.sqrt(p1[d1] * (1 - p1[d1]) / n)
        info = eng.get_server_info()
        assert info["kv_used"] == 0 and info["num_running_reqs"] == 0
    finally:
        eng.shutdown()
