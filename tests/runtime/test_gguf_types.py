"""GGUF tensor types beyond F32/Q8_0: files quantized by llama.cpp's own quantizer (llama-cpp-python, where
installed) or by the gguf package, converted and loaded; their logits stay within each type's rounding of the
float model's. A type the gguf package cannot dequantize is refused by name."""

import ctypes
import pathlib

import pytest
import torch
from safetensors.torch import load_file

from sglpy.runtime.model.gguf_convert import readable_tensor_types
from sglpy.runtime.model.loader import convert_gguf
from sglpy.runtime.testing.tiny_gguf import write_family_gguf
from sglpy.runtime.testing.tiny_model import make_family_model, make_tiny_model

from test_engine_model import _hf, hf_logits, make_runner, our_logits

gguf = pytest.importorskip("gguf")

# rows of 256 (the K-quants' super-block): hidden, heads x head_dim and the MLP width are all 256
TINY = dict(vocab_size=512, hidden_size=256, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64)
# relative logit error (norm of the difference / norm of the float logits) each type must stay under: about 1.5x
# what llama.cpp's quantizer measured on this random model (Q8_0 0.018, Q6_K 0.059, Q5_K 0.12, Q5_1 0.12,
# Q5_0 0.13, Q4_K 0.24, Q4_1 0.23, Q4_0 0.28, Q3_K 0.52, Q2_K 0.90; random weights quantize worse than trained
# ones). The exact check below (every tensor equal to gguf's own decoding of it) is what catches a wrong decode.
TOLERANCE = {"F16": 0.002, "BF16": 0.015, "Q8_0": 0.03, "Q6_K": 0.09, "Q5_1": 0.2, "Q5_0": 0.2, "Q5_K": 0.2,
             "Q4_1": 0.4, "Q4_0": 0.4, "Q4_K": 0.4, "Q3_K": 0.8, "Q2_K": 1.3}
# llama.cpp's file types writing that tensor type (with `pure`, every matrix gets it)
LLAMA_FTYPES = {"F16": "F16", "BF16": "BF16", "Q8_0": "Q8_0", "Q4_0": "Q4_0", "Q4_1": "Q4_1", "Q5_0": "Q5_0",
                "Q5_1": "Q5_1", "Q2_K": "Q2_K", "Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M", "Q6_K": "Q6_K"}
PROMPTS = [[1, 5, 9, 200, 300], list(range(100, 137))]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf_types")
    hf = make_family_model(root / "hf", "qwen3", extra=TINY)
    return root, hf, write_family_gguf(hf, root / "f32.gguf"), hf_logits(_hf(hf), PROMPTS)


def _quantized_file(root: pathlib.Path, hf: str, f32: str, qtype: str) -> pathlib.Path:
    """The tiny model's GGUF with every matrix in qtype: llama.cpp's quantizer where installed, else gguf's."""
    out = root / f"{qtype}.gguf"
    try:
        import llama_cpp
    except ImportError:
        llama_cpp = None
    if llama_cpp is not None:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{LLAMA_FTYPES[qtype]}")
        params.pure = True
        assert llama_cpp.llama_model_quantize(f32.encode(), str(out).encode(), ctypes.byref(params)) == 0
        return out
    try:
        return pathlib.Path(write_family_gguf(hf, out, quantize=qtype))
    except NotImplementedError:
        pytest.skip(f"gguf {qtype} quantization is not implemented and llama-cpp-python is not installed")


@pytest.mark.parametrize("qtype", sorted(TOLERANCE))
def test_quantized_gguf_loads_within_its_rounding(tiny, qtype):
    root, hf, f32, want = tiny
    path = _quantized_file(root, hf, f32, qtype)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
    assert types["blk.0.ffn_down.weight"] == qtype and types["blk.1.attn_q.weight"] == qtype
    folder = str(convert_gguf(path, root / f"converted-{qtype}"))
    state = load_file(pathlib.Path(folder) / "model.safetensors")
    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    for name, hf_name in (("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight"),
                          ("blk.1.attn_k.weight", "model.layers.1.self_attn.k_proj.weight"),
                          ("token_embd.weight", "model.embed_tokens.weight")):
        t = tensors[name]
        assert torch.equal(state[hf_name], torch.from_numpy(gguf.dequantize(t.data, t.tensor_type).copy()))
    for a, b in zip(our_logits(make_runner(folder, max_total_tokens=128), PROMPTS), want):
        err = ((a - b).norm() / b.norm()).item()
        assert 0 < err < TOLERANCE[qtype], f"{qtype}: relative logit error {err:.4f}"


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf_types_llama")
    hf = make_tiny_model(root / "hf", hidden=256, heads=4, kv_heads=2, intermediate=256, extra=dict(vocab_size=512))
    return root, hf, write_family_gguf(hf, root / "f32.gguf"), hf_logits(_hf(hf), PROMPTS)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_0"])
def test_llama_file_through_transformers_reader(tiny_llama, qtype):
    """A plain `llama` file (the Llama family goes to transformers' GGUF reader, which decodes with the same gguf
    package): a K-quant and a 32-block type load within their rounding (measured 0.26-0.32 for Q4_K)."""
    root, hf, f32, want = tiny_llama
    path = _quantized_file(root, hf, f32, qtype)
    folder = str(convert_gguf(path, root / f"converted-{qtype}"))
    down = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == "blk.0.ffn_down.weight")
    assert down.tensor_type.name == qtype
    state = load_file(pathlib.Path(folder) / "model.safetensors")
    assert torch.equal(state["model.layers.0.mlp.down_proj.weight"],
                       torch.from_numpy(gguf.dequantize(down.data, down.tensor_type).copy()))
    for a, b in zip(our_logits(make_runner(folder, max_total_tokens=128), PROMPTS), want):
        err = ((a - b).norm() / b.norm()).item()
        assert 0 < err < TOLERANCE[qtype], f"{qtype}: relative logit error {err:.4f}"


def test_every_common_type_is_readable():
    """The types llama.cpp users download are all read by the installed gguf package."""
    assert set(LLAMA_FTYPES) <= set(readable_tensor_types())


def test_unreadable_type_is_refused_by_name(tiny, tmp_path):
    """A tensor of a type gguf cannot dequantize (Q8_1, llama.cpp's activation scratch type) is named."""
    _, _, f32, _ = tiny
    good = gguf.GGUFReader(f32)
    w = gguf.GGUFWriter(str(tmp_path / "q81.gguf"), "qwen3")
    for key, field in good.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            w.add_key_value(key, field.contents(), field.types[0], field.types[-1] if len(field.types) > 1 else None)
    q81 = gguf.GGMLQuantizationType.Q8_1
    block, size = gguf.GGML_QUANT_SIZES[q81]
    for t in good.tensors:
        if t.name == "blk.0.ffn_up.weight":
            rows, cols = t.data.shape
            w.add_tensor(t.name, gguf.quants.np.zeros((rows, cols // block * size), dtype="uint8"), raw_dtype=q81)
        else:
            w.add_tensor(t.name, t.data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"GGUF tensor 'blk.0.ffn_up.weight' is stored as Q8_1, which the installed "
                                         r"gguf package .* cannot dequantize"):
        convert_gguf(tmp_path / "q81.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()
