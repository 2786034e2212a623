"""The non-Llama families (Qwen3, Gemma 2/3, Phi-3/4, Mixtral, Qwen3-MoE) vs HF transformers on tiny random
models built from scaled-down real configs; each family through the engine (JSON schema, prefix cache, chunked
prefill, quantization); the engine features a family refuses; MoE runs only the chosen experts."""

import json
import pathlib

import jsonschema
import pytest
import torch

from sglpy.runtime.engine import Engine
from sglpy.runtime.model.families import FAMILIES
from sglpy.runtime.model.moe import Routing, moe_reference, route
from sglpy.runtime.testing.tiny_model import FAMILY_CONFIGS, make_family_model

from test_engine_model import _hf, hf_logits, make_runner, our_logits

FAMILY_NAMES = sorted(FAMILY_CONFIGS)
PROMPTS = [[1, 5, 9, 200, 3000], [7], list(range(100, 137)), [42, 43]]  # the 37-token one crosses the windows


@pytest.fixture(scope="module")
def family_paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {f: make_family_model(root / f, f) for f in FAMILY_NAMES}


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_logits_match_hf_ragged_batch(family_paths, family):
    path = family_paths[family]
    runner = make_runner(path, max_total_tokens=512, max_running_requests=8)
    ours = our_logits(runner, PROMPTS)
    theirs = hf_logits(_hf(path), PROMPTS)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape
        assert (a - b).abs().max().item() <= 2e-5  # float32 rounding only (a soft-cap left out: 1.6e-4)
        assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.parametrize("family,extra", [
    ("mixtral", dict(sliding_window=8)),  # Mistral-style: every layer windowed when sliding_window is set
    ("qwen3-moe", dict(sliding_window=8, use_sliding_window=True)),
    ("qwen3", dict(sliding_window=8, use_sliding_window=True, max_window_layers=1)),  # per layer_types
])
def test_optional_sliding_windows_match_hf(tmp_path, family, extra):
    path = make_family_model(tmp_path / family, family, extra=extra)
    prompt = [list(range(100, 137))]
    ours = our_logits(make_runner(path, max_total_tokens=256), prompt)
    assert (ours[0] - hf_logits(_hf(path), prompt)[0]).abs().max().item() <= 2e-5


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_greedy_matches_hf_generate(family_paths, family):
    """16 greedy tokens of two prompts batched together (decode steps cross the sliding windows)."""
    path = family_paths[family]
    eng = Engine(path, quantization="none", max_total_tokens=1024, grammar_workers=0)
    try:
        prompts = [[1, 17, 300, 4000], list(range(500, 530))]
        outs = eng.generate(input_ids=prompts, sampling_params={"max_new_tokens": 16, "temperature": 0,
                                                                 "ignore_eos": True})
    finally:
        eng.shutdown()
    hf = _hf(path)
    for ids, out in zip(prompts, outs):
        # greedy equality as one teacher-forced HF forward (what generate() would pick at every step; its
        # step-by-step loop costs seconds per family)
        full = ids + out["output_ids"]
        with torch.no_grad():
            picks = hf(torch.tensor([full])).logits[0, len(ids) - 1:-1].argmax(-1).tolist()
        assert len(out["output_ids"]) == 16 and picks == out["output_ids"]


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_engine_json_schema_prefix_cache_chunked_prefill(family_paths, family):
    """Default quantization (int8 on CPU: the MoE experts packed per expert), chunks of 16 tokens, the radix cache."""
    path = family_paths[family]
    eng = Engine(path, max_total_tokens=2048, chunked_prefill_size=16, debug_invariants=True)
    try:
        shared = list(range(1000, 1040))  # 40 tokens: three chunks
        sp = {"max_new_tokens": 60, "temperature": 0, "json_schema": json.dumps(PERSON)}
        first = eng.generate(input_ids=shared + [5], sampling_params=sp)
        second = eng.generate(input_ids=shared + [5], sampling_params=sp)
        third = eng.generate(input_ids=shared + [6, 7], sampling_params=sp)
        for out in (first, second, third):
            assert out["meta_info"]["finish_reason"]["type"] == "stop", out
            jsonschema.validate(json.loads(out["text"]), PERSON)
        assert second["meta_info"]["cached_tokens"] >= 40 and third["meta_info"]["cached_tokens"] >= 40
        assert first["meta_info"]["jump_forward_tokens"] > 0  # the schema's forced '{"name": "' was jumped
        assert second["output_ids"] == first["output_ids"]
        assert eng.get_server_info()["kv_used"] == 0
    finally:
        eng.shutdown()


def test_sharded_folder_loads_like_one_file(family_paths, tmp_path):
    """save_pretrained's sharded safetensors (+ index) give the same logits as the one-file folder."""
    sharded = make_family_model(tmp_path / "sharded", "qwen3-moe", max_shard_size="2MB")
    assert len(list(pathlib.Path(sharded).glob("*.safetensors"))) > 1
    assert (pathlib.Path(sharded) / "model.safetensors.index.json").exists()
    a = our_logits(make_runner(sharded, max_total_tokens=128), PROMPTS[:2])
    b = our_logits(make_runner(family_paths["qwen3-moe"], max_total_tokens=128), PROMPTS[:2])
    assert all(torch.equal(x, y) for x, y in zip(a, b))


# what llama.cpp's files cannot say is kept out of these models: Gemma 2's query_pre_attn_scalar is head_dim, Gemma 3
# has llama.cpp's fixed pattern (every 6th layer global)
GGUF_EXTRAS = {"gemma2": dict(query_pre_attn_scalar=32), "gemma3": dict(num_hidden_layers=6, layer_types=None),
               "qwen3": dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                                              "original_max_position_embeddings": 1024})}  # Qwen3's long context


@pytest.mark.parametrize("family", ["qwen3", "qwen3-moe", "gemma2", "gemma3", "phi3", "phi4-mini", "mixtral"])
def test_family_gguf_converts_and_matches_hf(tmp_path, family):
    """A float32 GGUF written under llama.cpp's names and layouts (gemma +1 norms, permuted q/k of a `llama`
    Mixtral file, stacked experts, fused Phi-3 qkv/gate_up, LongRoPE factor tensors) converts as
    resolve_model_path does for a .gguf and loads equal to the HF model it was written from."""
    from sglpy.runtime.model.gguf_convert import gguf_hf_architecture
    from sglpy.runtime.model.loader import convert_gguf
    from sglpy.runtime.testing.tiny_gguf import write_family_gguf

    hf = make_family_model(tmp_path / "hf", family, extra=dict(vocab_size=512, **GGUF_EXTRAS.get(family, {})))
    gguf_file = pathlib.Path(write_family_gguf(hf, tmp_path / "gguf" / f"tiny-{family}.gguf"))
    hf_arch = json.loads((pathlib.Path(hf) / "config.json").read_text())["architectures"][0]
    assert gguf_hf_architecture(gguf_file) == hf_arch
    folder = str(convert_gguf(gguf_file, tmp_path / "converted"))
    converted = json.loads((pathlib.Path(folder) / "config.json").read_text())
    assert converted["architectures"] == [hf_arch] and converted["eos_token_id"] == 2
    prompts = [[1, 5, 9, 200, 300], list(range(100, 137))]  # 37 tokens: past the 8-token windows
    ours = our_logits(make_runner(folder, max_total_tokens=128), prompts)
    for a, b in zip(ours, hf_logits(_hf(hf), prompts)):
        assert (a - b).abs().max().item() <= 2e-5


def test_q8_0_gguf_loads_within_its_rounding(tmp_path):
    """A Mixtral GGUF with Q8_0 matrices (stacked experts and permuted q/k quantized as llama.cpp stores them)
    dequantizes to a model within Q8_0's rounding of the float one."""
    from sglpy.runtime.model.loader import convert_gguf
    from sglpy.runtime.testing.tiny_gguf import write_family_gguf

    hf = make_family_model(tmp_path / "hf", "mixtral", extra=dict(vocab_size=512))
    folder = str(convert_gguf(pathlib.Path(write_family_gguf(hf, tmp_path / "q8.gguf", quantize="Q8_0")),
                              tmp_path / "converted"))
    prompts = [[1, 5, 9, 200, 300], list(range(100, 137))]
    for a, b in zip(our_logits(make_runner(folder, max_total_tokens=128), prompts), hf_logits(_hf(hf), prompts)):
        assert 0 < ((a - b).norm() / b.norm()).item() < 0.05  # measured 1.4-1.6% (float32 files: < 1e-6)


def test_gguf_of_an_unknown_tensor_is_named(tmp_path):
    """A family GGUF holding a tensor the converter has no HF name for is refused with the tensor's name."""
    import gguf

    from sglpy.runtime.model.gguf_convert import convert_family_gguf
    from sglpy.runtime.testing.tiny_gguf import write_family_gguf

    hf = make_family_model(tmp_path / "hf", "qwen3", extra=dict(vocab_size=512))
    good = gguf.GGUFReader(write_family_gguf(hf, tmp_path / "good.gguf"))
    w = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "qwen3")
    for key, field in good.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            w.add_key_value(key, field.contents(), field.types[0], field.types[-1] if len(field.types) > 1 else None)
    for t in good.tensors:
        w.add_tensor(t.name, t.data)
    w.add_tensor("blk.0.attn_mystery.weight", good.tensors[0].data[:2])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"GGUF tensor 'blk.0.attn_mystery.weight' has no HF counterpart"):
        convert_family_gguf(tmp_path / "bad.gguf", tmp_path / "out")


def test_refusals_name_the_combination(family_paths):
    with pytest.raises(ValueError, match=r"CUDA graphs \(disable_cuda_graph=False\) is not supported with "
                                         r"MixtralForCausalLM \(mixtral\): its experts"):
        Engine(family_paths["mixtral"], quantization="none", disable_cuda_graph=False, max_total_tokens=256)
    assert set(FAMILIES) >= {"Qwen3ForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM",
                             "MixtralForCausalLM", "Qwen3MoeForCausalLM"}


def test_unsupported_architecture_is_named(tmp_path):
    from transformers import AutoConfig

    from sglpy.runtime.model.decoder import build_model

    cfg = AutoConfig.for_model("gpt2")
    cfg.architectures = ["GPT2LMHeadModel"]
    with pytest.raises(ValueError, match="unsupported architecture 'GPT2LMHeadModel'"):
        build_model(cfg)


def test_moe_reads_only_the_chosen_experts():
    """Unchosen experts' weights are NaN: the output stays finite and equals the dense sum over chosen experts."""
    torch.manual_seed(0)
    e, h, i, t, k = 8, 16, 12, 5, 2
    w_gu, w_d = torch.randn(e, 2 * i, h), torch.randn(e, h, i)
    x, logits = torch.randn(t, h), torch.randn(t, e)
    r = route(logits, k, renormalize=True)
    assert torch.allclose(r.weights.sum(-1), torch.ones(t))
    chosen = set(r.ids.flatten().tolist())
    poisoned_gu, poisoned_d = w_gu.clone(), w_d.clone()
    for j in set(range(e)) - chosen:
        poisoned_gu[j], poisoned_d[j] = float("nan"), float("nan")
    out = moe_reference(x, poisoned_gu, poisoned_d, r)
    dense = torch.zeros_like(x)
    for tok in range(t):
        for slot in range(k):
            j, w = r.ids[tok, slot].item(), r.weights[tok, slot]
            g, u = (x[tok] @ w_gu[j].t()).chunk(2)
            dense[tok] += w * ((torch.nn.functional.silu(g) * u) @ w_d[j].t())
    assert torch.isfinite(out).all() and torch.allclose(out, dense, atol=1e-5)
    # Qwen3-MoE with norm_topk_prob=False keeps the softmax weights of the whole expert set
    raw = route(logits, k, renormalize=False)
    assert torch.allclose(raw.weights, torch.softmax(logits, -1).topk(k).values)
    assert moe_reference(x[:0], w_gu, w_d, Routing(r.ids[:0], r.weights[:0])).shape == (0, h)


@pytest.mark.parametrize("mode,tol", [("int8", 0.03), ("int4", 0.2)])
def test_quantized_experts_run_only_the_chosen_ones(mode, tol):
    """int8/int4 experts (packed per expert, CPU) follow the float reference within the quantization error, and
    only the experts some token chose are called."""
    from sglpy.runtime.model.moe import moe_experts
    from sglpy.runtime.model.quantization import QuantizedLinear

    torch.manual_seed(0)
    e, h, i, t = 8, 64, 32, 6
    w_gu, w_d = torch.randn(e, 2 * i, h) * 0.1, torch.randn(e, h, i) * 0.1
    x, r = torch.randn(t, h), route(torch.randn(t, e), 2, renormalize=True)
    called = []
    gate_up = [QuantizedLinear.from_weight(w, None, mode, None) for w in w_gu]
    for j, q in enumerate(gate_up):
        q.register_forward_hook(lambda m, a, o, j=j: called.append(j))
    down = [QuantizedLinear.from_weight(w, None, mode, None) for w in w_d]
    out, ref = moe_experts(x, r, gate_up, down), moe_reference(x, w_gu, w_d, r)
    assert ((out - ref).norm() / ref.norm()).item() < tol
    assert sorted(called) == sorted(set(r.ids.flatten().tolist()))  # each chosen expert once, no other


def test_moe_models_quantize_their_experts(family_paths):
    """auto is int8 on CPU for MoE models too; the packed experts replace the float stacks (Mixtral's the same way:
    the JSON-schema engine test runs it with auto)."""
    for fam in ("qwen3-moe",):
        runner = make_runner(family_paths[fam], quantization="auto", max_total_tokens=128)
        block = runner.model.model.layers[0].mlp
        assert runner.quantization == "int8" and not hasattr(block, "w_gate_up")
        assert len(block.q_gate_up) == block.num_experts and block.q_down[0].packed.kind == "int8"
        ours = our_logits(runner, PROMPTS[:2])
        ref = our_logits(make_runner(family_paths[fam], quantization="none", max_total_tokens=128), PROMPTS[:2])
        for a, b in zip(ours, ref):
            assert ((a - b).norm() / b.norm()).item() < 0.1  # int8 weights and activations: a few percent


@pytest.mark.parametrize("family", ["qwen3-moe"])
def test_tensor_parallel_equals_one_rank(family_paths, family):
    """tp=2 (gloo, CPU) gives tp=1's greedy tokens and logprobs: Qwen3-MoE (every expert's intermediate dimension
    split over the ranks, the router whole, the experts' partial sums all-reduced; per-head q/k norms). Qwen3,
    Gemma 2/3 (one KV head shared by both ranks, windows, two rope tables), Phi-3 (fused qkv/gate_up split before
    sharding), Phi-4-mini and Mixtral run the same sharding (checked the same way when it was built; 15-20 s each on
    2 cores)."""
    kw = dict(num_threads=1, max_total_tokens=2048, chunked_prefill_size=8, grammar_workers=0, quantization="none")
    prompts = [[1, 17, 300, 4000], list(range(500, 530))]  # 30 tokens: past the 8-token windows
    sp = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    outs = {}
    for tp in (1, 2):
        with Engine(family_paths[family], tp_size=tp, **kw) as eng:
            outs[tp] = eng.generate(input_ids=prompts, sampling_params=sp, return_logprob=True)
    for a, b in zip(outs[1], outs[2]):
        assert a["output_ids"] == b["output_ids"]
        la = [t[0] for t in a["meta_info"]["output_token_logprobs"]]
        assert la == pytest.approx([t[0] for t in b["meta_info"]["output_token_logprobs"]], abs=1e-4)


@pytest.mark.parametrize("family", ["qwen3", "gemma2", "gemma3"])
def test_graph_decode_path_equals_eager(family_paths, family):
    """Families without experts take the CUDA-graph decode path (padded buckets, static buffers: run eagerly on CPU
    here, captured on CUDA): the same greedy tokens as eager decode. Gemma's windows and soft-caps are per-layer
    constants of the attention kernels; the 30-token prompt decodes past the 8-token windows."""
    prompts = [[1, 17, 300, 4000], list(range(500, 530)), [9, 9, 9]]
    sp = {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}
    outs = {}
    for disable in (True, False):
        eng = Engine(family_paths[family], max_total_tokens=2048, max_running_requests=4, cuda_graph_max_bs=4,
                     disable_cuda_graph=disable, quantization="none", grammar_workers=0)
        try:
            outs[disable] = [o["output_ids"] for o in eng.generate(input_ids=prompts, sampling_params=sp)]
            if not disable:
                assert eng.runner.graphs is not None and eng.runner.graphs.replays > 0
        finally:
            eng.shutdown()
    assert outs[True] == outs[False]


@pytest.mark.parametrize("family,windows,softcap", [("gemma2", {8}, 50.0), ("gemma3", {8}, 0.0)])
def test_windowed_layers_run_the_native_kernels(family_paths, family, windows, softcap, monkeypatch):
    """Gemma's sliding-window and soft-capped layers run the native CPU attention kernels, each layer passing its
    window and cap (the torch references are never called), in prefill and decode, and still give HF's tokens."""
    import importlib

    from sglpy.kernels import decode_plan
    from sglpy.kernels.cpu_native import native_lib

    extend_attention = importlib.import_module("sglpy.kernels.extend_attention")  # the package exports a function

    if native_lib() is None:
        pytest.skip("the native CPU kernels are not built here")
    calls = []

    def spy(name, fn, at):
        def run(*a, **kw):
            calls.append((name, a[at], a[at + 1]))  # (kernel, window, softcap) as the layer passed them
            return fn(*a, **kw)
        return run

    def refuse(*a, **kw):
        raise AssertionError("a windowed layer fell back to the torch reference")

    monkeypatch.setattr(decode_plan, "decode_attention_cpu", spy("decode", decode_plan.decode_attention_cpu, 8))
    monkeypatch.setattr(extend_attention, "extend_attention_cpu", spy("extend", extend_attention.extend_attention_cpu,
                                                                      9))
    monkeypatch.setattr(decode_plan, "decode_attention_reference", refuse)
    monkeypatch.setattr(extend_attention, "extend_attention_reference", refuse)
    prompts = [[1, 17, 300, 4000], list(range(500, 530))]  # 30 tokens: past the 8-token windows
    with Engine(family_paths[family], quantization="none", max_total_tokens=1024, grammar_workers=0) as eng:
        outs = eng.generate(input_ids=prompts, sampling_params={"max_new_tokens": 12, "temperature": 0,
                                                                 "ignore_eos": True})
    for kind in ("decode", "extend"):
        seen = {(w, c) for k, w, c in calls if k == kind}
        assert {w for w, _ in seen} == windows | {0}, (kind, seen)  # sliding layers and global ones
        assert {c for _, c in seen} == {softcap}, (kind, seen)
    hf = _hf(family_paths[family])
    for ids, out in zip(prompts, outs):
        full = ids + out["output_ids"]
        with torch.no_grad():
            picks = hf(torch.tensor([full])).logits[0, len(ids) - 1:-1].argmax(-1).tolist()
        assert picks == out["output_ids"]


def test_graph_blockers_name_the_layer_feature(family_paths):
    from transformers import AutoConfig

    from sglpy.runtime.model.families import check_feature, graph_blocker

    from sglpy.runtime.model.families import determinism_blocker

    # windows and soft-caps run in the attention kernels: only the experts' host-side grouping blocks graphs
    for family in ("gemma2", "gemma3", "phi3", "qwen3"):
        assert graph_blocker(AutoConfig.from_pretrained(family_paths[family]), max_context=4096) is None
    assert graph_blocker(AutoConfig.from_pretrained(family_paths["mixtral"])).startswith("its experts")
    with pytest.raises(ValueError, match=r"CUDA graphs is not supported with Qwen3MoeForCausalLM \(qwen3_moe\): "
                                         r"its experts"):
        check_feature(AutoConfig.from_pretrained(family_paths["qwen3-moe"]), "cuda_graph", "CUDA graphs")
    # deterministic inference refuses only the experts, and only off CPU (tests/runtime/test_determinism.py)
    for family in ("gemma2", "gemma3", "phi3", "qwen3", "mixtral"):
        assert determinism_blocker(AutoConfig.from_pretrained(family_paths[family]), "cpu") is None
    assert determinism_blocker(AutoConfig.from_pretrained(family_paths["mixtral"]), "cuda").startswith("its experts")
