"""The packed weights cache (runtime/model/pack_cache.py): a GGUF model is packed once, later loads read the packed
weights back with identical logits, and a damaged or half-written entry is packed again and replaced."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from sglpy.runtime.model import pack_cache, quantization

from test_engine_model import make_runner, our_logits

PROMPTS = [[1, 5, 9, 200, 300], list(range(100, 137))]


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory):
    """A tiny Llama stored as Q4_1 blocks (so quantization auto picks int4), converted once for the module."""
    from sglpy.runtime.model.loader import convert_gguf
    from sglpy.runtime.testing import make_tiny_model
    from sglpy.runtime.testing.tiny_gguf import write_family_gguf

    tmp = tmp_path_factory.mktemp("pack-cache")
    hf = make_tiny_model(tmp / "hf", num_layers=3, extra=dict(vocab_size=512))
    gguf_file = pathlib.Path(write_family_gguf(hf, tmp / "tiny.gguf", quantize="Q4_1"))
    return str(convert_gguf(gguf_file, tmp / "converted", hf_copy=False))


@pytest.fixture
def gguf_folder(gguf_model, tmp_path, monkeypatch):
    """The tiny GGUF model, with a fresh packed-weights folder of its own ($SGLPY_CACHE stays: the native kernels
    built there are not built again)."""
    monkeypatch.setattr(pack_cache, "cache_folder", lambda: tmp_path / "packed")
    monkeypatch.delenv(pack_cache.ENV_DISABLE, raising=False)
    return gguf_model


def _entries() -> list[pathlib.Path]:
    root = pack_cache.cache_folder()
    return sorted(p for p in root.iterdir() if ".tmp" not in p.name) if root.is_dir() else []


def _load(path: str, monkeypatch, packs: bool) -> tuple[str, list[torch.Tensor]]:
    """Load through the runner (quantization auto); packs=False: any packing fails the test."""
    calls = []
    real = quantization.QuantizedLinear.from_weight.__func__

    def counted(cls, *a, **kw):
        calls.append(1)
        return real(cls, *a, **kw)

    with monkeypatch.context() as m:
        m.setattr(quantization.QuantizedLinear, "from_weight", classmethod(counted))
        runner = make_runner(path, quantization="auto", max_total_tokens=128)
    assert bool(calls) == packs, f"{len(calls)} layers packed"
    return runner.quantization, our_logits(runner, PROMPTS)


def test_second_load_reads_the_packed_weights_with_identical_logits(gguf_folder, monkeypatch):
    mode, first = _load(gguf_folder, monkeypatch, packs=True)
    assert mode == "int4"
    [entry] = _entries()
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["mode"] == "int4" and "head" in meta["linears"] and "layers.2.down_proj" in meta["linears"]
    mode2, second = _load(gguf_folder, monkeypatch, packs=False)  # no projection is packed: all read back
    assert mode2 == "int4"
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    # another quantization is another entry
    runner = make_runner(gguf_folder, quantization="int8", max_total_tokens=128)
    assert runner.quantization == "int8" and len(_entries()) == 2


@pytest.mark.parametrize("damage", ["flip a byte", "cut short", "no meta", "other code"])
def test_a_damaged_entry_is_packed_again_and_replaced(gguf_folder, monkeypatch, damage):
    _, first = _load(gguf_folder, monkeypatch, packs=True)
    [entry] = _entries()
    weights, meta = entry / "weights.safetensors", entry / "meta.json"
    data = bytearray(weights.read_bytes())
    if damage == "flip a byte":
        data[len(data) // 2] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif damage == "cut short":
        weights.write_bytes(bytes(data[:len(data) // 3]))
    elif damage == "no meta":  # a write that died between the two files (never renamed into place normally)
        meta.unlink()
    else:  # same folder name, written by another packing code
        m = json.loads(meta.read_text())
        m["key"]["code"] = "0" * 64
        meta.write_text(json.dumps(m))
    _, again = _load(gguf_folder, monkeypatch, packs=True)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    [entry] = _entries()  # replaced in place: the next load reads it
    _, third = _load(gguf_folder, monkeypatch, packs=False)
    assert all(torch.equal(a, b) for a, b in zip(first, third))


def test_abandoned_writes_and_entries_of_deleted_models_are_pruned(gguf_folder, monkeypatch, tmp_path):
    import os
    import time

    root = pack_cache.cache_folder()
    root.mkdir(parents=True)
    stale = root / "m-int4-0123.tmpabc"
    stale.mkdir()
    os.utime(stale, (time.time() - 7200,) * 2)
    gone = root / "gone-int4-0123"
    gone.mkdir()
    (gone / "meta.json").write_text(json.dumps({"key": {"gguf": str(tmp_path / "deleted.gguf")}}))
    _load(gguf_folder, monkeypatch, packs=True)
    assert not stale.exists() and not gone.exists() and len(_entries()) == 1


def test_no_cache_for_float_models_or_when_disabled(tiny_model_path, gguf_folder, monkeypatch):
    cpu = torch.device("cpu")
    assert pack_cache.PackCache.open(tiny_model_path, "auto", cpu, False) is None  # safetensors: not a GGUF
    assert pack_cache.PackCache.open(gguf_folder, "none", cpu, False) is None
    monkeypatch.setenv(pack_cache.ENV_DISABLE, "1")
    assert pack_cache.PackCache.open(gguf_folder, "auto", cpu, False) is None
