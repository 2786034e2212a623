"""Deterministic inference (--enable-deterministic-inference, docs/determinism.md) end to end on tiny random models:
seeded sampled and greedy requests give bit-identical token ids and logprobs alone, all together, over a cached
prefix, and with chunked prefill of 64, in every CPU quantization mode."""

from __future__ import annotations

import pytest

from sglpy.runtime.engine import Engine

PREFIX = " ".join(f"item{i}" for i in range(45))  # > 64 tokens: chunked prefill of 64 splits every prompt


def _requests(n: int, tokens: int) -> tuple[list[str], list[dict]]:
    """n seeded sampled requests, then the same n prompts greedy; every prompt shares PREFIX."""
    prompts = [f"{PREFIX} case {i} goes" for i in range(n)] * 2
    params = [{"max_new_tokens": tokens, "temperature": 0.9, "top_p": 0.95, "seed": 500 + i, "ignore_eos": True}
              for i in range(n)]
    params += [{"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True} for _ in range(n)]
    return prompts, params


def _result(out: dict) -> tuple[list[int], list[float]]:
    return out["output_ids"], [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]


def _run(eng: Engine, prompts, params, batched: bool):
    eng.flush_cache()
    if batched:
        outs = eng.generate(prompts, params, return_logprob=True)
    else:  # each request alone, nothing cached
        outs = []
        for p, sp in zip(prompts, params):
            eng.flush_cache()
            outs.append(eng.generate(p, sp, return_logprob=True))
    return outs


def check_matrix(model_path: str, quantization: str, n: int, tokens: int) -> None:
    """Alone vs together vs cached prefix vs chunked prefill 64: every request bit-identical (ids and logprobs)."""
    prompts, params = _requests(n, tokens)
    common = dict(quantization=quantization, enable_deterministic_inference=True, max_total_tokens=8192)
    with Engine(model_path, **common) as eng:
        alone = [_result(o) for o in _run(eng, prompts, params, batched=False)]
        together = [_result(o) for o in _run(eng, prompts, params, batched=True)]
        eng.flush_cache()
        eng.generate(PREFIX, {"max_new_tokens": 1})  # the shared prefix is now in the radix cache
        outs = eng.generate(prompts, params, return_logprob=True)
        assert all(o["meta_info"]["cached_tokens"] > 0 for o in outs)
        cached = [_result(o) for o in outs]
    with Engine(model_path, chunked_prefill_size=64, **common) as eng:
        chunked = [_result(o) for o in _run(eng, prompts, params, batched=True)]
    for name, got in (("together", together), ("cached prefix", cached), ("chunked prefill 64", chunked)):
        same = sum(a == b for a, b in zip(alone, got))
        assert same == len(alone), f"{quantization}: {name} matched alone in {same}/{len(alone)} requests"


@pytest.mark.parametrize("quantization", ["none", "int8", "int4"])
def test_deterministic_matrix_small(tiny_model_path, quantization):
    check_matrix(tiny_model_path, quantization, n=3, tokens=5)


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_deterministic_matrix_windowed_soft_capped(tmp_path, family):
    """Sliding windows (8 keys, shorter than every prompt) and soft-caps run inside the native attention kernels with
    their fixed key blocks. Gemma 2: window, attention and final soft-cap. Gemma 3: window on two of three layers,
    q/k norms over a single kv head (whose strided k rows once took the native norm alone and torch's batched)."""
    from sglpy.runtime.testing.tiny_model import make_family_model

    check_matrix(str(make_family_model(tmp_path / family, family)), "none", n=3, tokens=5)


@pytest.mark.parametrize("family,quantization", [("mixtral", "none"), ("qwen3-moe", "int8"), ("mixtral", "int4")])
def test_deterministic_matrix_mixture_of_experts(tmp_path, family, quantization):
    """Experts on CPU: every row (prompt or generated, any row count) takes the native per-row call and each token
    sums its own experts in a fixed order; the router runs the native GEMV. Without that, float32 experts ran
    torch's GEMM per expert over the step's grouped tokens (together matched 4/6)."""
    from sglpy.runtime.testing.tiny_model import make_family_model

    check_matrix(str(make_family_model(tmp_path / family, family)), quantization, n=3, tokens=5)


@pytest.mark.slow
@pytest.mark.parametrize("quantization", ["none", "int8", "int4", "auto"])
def test_deterministic_matrix_20_sampled_20_greedy(tiny_model_path, quantization):
    check_matrix(tiny_model_path, quantization, n=20, tokens=16)


def test_without_the_flag_a_row_depends_on_its_batch(tiny_model_path):
    """The control that shows the comparison above can fail: quantization none without the flag runs torch's
    float32 GEMM, whose reduction order depends on the row count, so some logprob differs alone vs together."""
    prompts, params = _requests(3, 5)
    with Engine(tiny_model_path, quantization="none", max_total_tokens=8192) as eng:
        alone = [_result(o) for o in _run(eng, prompts, params, batched=False)]
        together = [_result(o) for o in _run(eng, prompts, params, batched=True)]
    assert any(a[1] != b[1] for a, b in zip(alone, together))


def test_flag_reaches_the_model(tiny_model_path):
    """The runner turns the flag into the model's batch-invariant paths (the fused decode layers with attention as
    one-token extends; every projection and the lm_head split by row kind: decode rows native, prefill rows the
    dense copy in fixed tiles)."""
    from sglpy.runtime.model.quantization import QuantizedLinear, RowByRowLinear

    with Engine(tiny_model_path, quantization="int4", enable_deterministic_inference=True,
                max_total_tokens=1024) as eng:
        model = eng.runner.model
        assert model.batch_invariant and model.native_layers is not None and model.row_split is not None
        for lin in (model.model.layers[0].self_attn.qkv_proj, model.model.layers[-1].mlp.down_proj,
                    model.logits_head):
            assert isinstance(lin, RowByRowLinear) and lin.split_dense and isinstance(lin.inner, QuantizedLinear)
        assert model.logits_head.head
    with Engine(tiny_model_path, quantization="none", enable_deterministic_inference=True,
                max_total_tokens=1024) as eng:
        assert isinstance(eng.runner.model.logits_head, RowByRowLinear)


def test_deterministic_with_constraints_and_jump_forward(tiny_model_path):
    """Regex-constrained seeded requests (jump-forward on: forced spans are appended as extends) alone vs together."""
    prompts = [f"{PREFIX} record {i}:" for i in range(4)]
    params = [{"max_new_tokens": 24, "temperature": 1.0, "seed": 70 + i, "ignore_eos": True,
               "regex": r"\{\"id\": [0-9]{1,4}, \"tag\": \"[a-z]{2,6}\"\}"} for i in range(4)]
    with Engine(tiny_model_path, quantization="int8", enable_deterministic_inference=True,
                max_total_tokens=8192) as eng:
        alone = [_result(o) for o in _run(eng, prompts, params, batched=False)]
        together = [_result(o) for o in _run(eng, prompts, params, batched=True)]
        jumped = sum(o["meta_info"].get("jump_forward_tokens", 0) for o in
                     _run(eng, prompts, params, batched=True))
    assert jumped > 0  # the forced spans ("{\"id\": ", ...) went through jump-forward
    assert alone == together


def test_settings_it_cannot_honour_are_refused_by_name(tmp_path, tiny_model_path, monkeypatch):
    from sglpy.runtime.testing.tiny_model import make_family_model

    with pytest.raises(ValueError, match="tensor parallelism"):
        Engine(tiny_model_path, enable_deterministic_inference=True, tp_size=2)
    from sglpy.runtime.model.families import determinism_blocker
    from transformers import AutoConfig

    for family in ("qwen3-moe", "mixtral"):  # experts: allowed on CPU, refused where the fused kernel runs them
        config = AutoConfig.from_pretrained(make_family_model(tmp_path / family, family))
        assert determinism_blocker(config, "cpu") is None
        assert "experts" in determinism_blocker(config, "cuda")
    monkeypatch.setenv("SGLPY_DISABLE_CPU_KERNELS", "1")
    with pytest.raises(ValueError, match="native CPU kernels"):
        Engine(tiny_model_path, enable_deterministic_inference=True)
