"""Loading without a float copy of the model: GGUF weights read straight from the file, each layer packed as it
loads, many-row calls through dequantized tiles instead of a dense copy."""

from __future__ import annotations

import pathlib

import pytest
import torch

from sglpy.runtime.testing import make_tiny_model
from sglpy.runtime.testing.tiny_model import make_family_model

from test_engine_model import _hf, hf_logits, make_runner, our_logits


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_gguf_weights_load_from_the_file_and_match_hf(tmp_path, arch):
    """A converted folder without safetensors (config + tokenizer + the file's tensor index): the loader reads the
    GGUF's tensors itself (a `llama` file's q/k permutation undone, Qwen2's biases) and matches the HF model."""
    from sglpy.runtime.model.loader import convert_gguf, resolve_model_path
    from sglpy.runtime.testing.tiny_gguf import write_family_gguf

    if arch == "qwen3":
        hf = make_family_model(tmp_path / "hf", "qwen3", extra=dict(vocab_size=512))
    else:
        hf = make_tiny_model(tmp_path / "hf", arch=arch, extra=dict(vocab_size=512),
                             tie_word_embeddings=arch == "llama")
    gguf_file = pathlib.Path(write_family_gguf(hf, tmp_path / f"tiny-{arch}.gguf"))
    folder = convert_gguf(gguf_file, tmp_path / "converted", hf_copy=False)
    assert not list(folder.glob("*.safetensors"))
    assert resolve_model_path(folder) == str(folder)
    prompts = [[1, 5, 9, 200, 300], list(range(100, 137))]
    for a, b in zip(our_logits(make_runner(str(folder), max_total_tokens=128), prompts),
                    hf_logits(_hf(hf), prompts)):
        assert (a - b).abs().max().item() <= 2e-5


def test_layers_are_packed_while_loading(tmp_path, monkeypatch):
    """At most two layers (the first and the last, which quantization auto judges) are ever float at once, and no
    packed layer keeps a dense copy."""
    from sglpy.kernels.cpu_native import native_lib
    from sglpy.runtime.model import quantization

    if native_lib() is None:
        pytest.skip("the native kernels are not built here")
    path = make_tiny_model(tmp_path / "m", num_layers=4)
    most = []
    real = quantization.LayerPacker.__call__

    def spy(self, model, index):
        real(self, model, index)
        floats = sum(isinstance(layer.self_attn.qkv_proj, torch.nn.Linear) for layer in model.model.layers
                     if not any(p.is_meta for p in layer.parameters()))
        most.append(floats)

    monkeypatch.setattr(quantization.LayerPacker, "__call__", spy)
    runner = make_runner(path, quantization="auto", max_total_tokens=64)
    assert runner.quantization == "int8" and max(most) <= 2 and most[-1] == 0
    for layer in runner.model.model.layers:
        p = layer.mlp.gate_up_proj.packed
        assert p.dense is None and p.tiles in (torch.float32, torch.bfloat16)


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("tiles", [torch.float32, torch.bfloat16])
def test_many_rows_through_dequantized_tiles(kind, tiles):
    """Past NATIVE_MAX_ROWS rows a tiled layer dequantizes tiles of its rows per call: the same product as the
    reference over the dequantized weights (bf16 tiles: within bf16 rounding of the activations)."""
    from sglpy.kernels.cpu_native import native_lib
    from sglpy.kernels.quant_linear import pack_linear, quant_linear, quant_linear_reference

    if native_lib() is None:
        pytest.skip("the native kernels are not built here")
    g = torch.Generator().manual_seed(0)
    w, bias = torch.randn(1000, 2048, generator=g), torch.randn(1000, generator=g)  # 1000: a partial last tile
    p = pack_linear(w, bias, kind, 32, tiles=tiles)
    assert p.tiles == tiles and p.dense is None
    x = torch.randn(40, 2048, generator=g)
    y, ref = quant_linear(x, p), quant_linear_reference(x, p)
    tol = 1e-3 if tiles == torch.float32 else 2e-2
    assert (y - ref).abs().max().item() <= tol * ref.abs().max().item()


def test_large_tensor_dequantized_in_place_of_a_second_copy(tmp_path, monkeypatch):
    """A tensor read in several chunks equals the gguf package's whole dequantization, and its chunks are written
    straight into the result: the read's peak stays near the result's size (a list of parts beside their
    concatenation held twice the float tensor: the load peak of a 1B model's embedding table)."""
    import tracemalloc

    import gguf
    import numpy as np

    from sglpy.runtime.model import gguf_weights
    from sglpy.runtime.model.gguf_weights import GGUFWeights, tensor_index

    rng = np.random.default_rng(0)
    table = rng.standard_normal((512, 2048)).astype(np.float32)
    path = tmp_path / "t.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("token_embd.weight", gguf.quants.quantize(table, gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    monkeypatch.setattr(gguf_weights, "CHUNK_BYTES", 64 << 10)  # ~30 chunks
    weights = GGUFWeights(path, {}, tensor_index(path))
    tracemalloc.start()
    out = weights.read(weights.infos[0])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    want = gguf.quants.dequantize(gguf.quants.quantize(table, gguf.GGMLQuantizationType.Q8_0),
                                  gguf.GGMLQuantizationType.Q8_0)
    assert out.shape == (512, 2048) and np.array_equal(out, want)
    assert peak < 1.5 * out.nbytes, f"read peak {peak} bytes for a {out.nbytes}-byte tensor"


@pytest.mark.parametrize("qtype,head,bound", [("Q4_1", "int4", 0.05), ("Q8_0", "int8", 0.3)])
def test_head_is_int4_only_for_a_table_in_4bit_blocks(tmp_path, qtype, head, bound):
    """Mode int4 on a GGUF: the lm_head's copy is int4 when the file's (tied) table is in 4-bit blocks (re-quantizing
    only re-rounds their scales; a decode step then reads half the head's bytes), int8 when the table has 8 bits;
    the embedding lookups read the head's own rows either way (no second table), and the logits stay close to
    the file's weights run in float32 (bound: mean |error| / logit std; Q8_0's layers lose more to int4)."""
    from sglpy.kernels.cpu_native import native_lib
    from sglpy.kernels.quant_linear import dequantize
    from sglpy.runtime.model.loader import convert_gguf
    from sglpy.runtime.testing.tiny_gguf import write_family_gguf

    if native_lib() is None:
        pytest.skip("the native kernels are not built here")
    hf = make_tiny_model(tmp_path / "hf", extra=dict(vocab_size=512))
    folder = str(convert_gguf(pathlib.Path(write_family_gguf(hf, tmp_path / f"t.{qtype}.gguf", quantize=qtype)),
                              tmp_path / "converted", hf_copy=False))
    runner = make_runner(folder, quantization="int4", max_total_tokens=128)
    packed, emb = runner.model.logits_head.packed, runner.model.model.embed_tokens
    assert packed.kind == head and emb.kind == head and emb.qweight.data_ptr() == packed.qweight.data_ptr()
    ids = torch.tensor([0, 7, 8, 300, 511])
    torch.testing.assert_close(emb(ids), dequantize(packed)[ids])
    prompts = [[1, 5, 9, 200, 300], list(range(100, 137))]
    for a, b in zip(our_logits(runner, prompts), our_logits(make_runner(folder, max_total_tokens=128), prompts)):
        err = ((a - b).abs().mean() / b.std()).item()
        assert 0 < err < bound, err
