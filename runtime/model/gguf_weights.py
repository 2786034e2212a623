"""Weights read straight from a GGUF file, one tensor at a time, under their HF checkpoint names.

The loader streams a model from here layer by layer (runtime/model/loader.py): each tensor's bytes are read with
pread (the file is never mapped, so its pages count in the page cache, not in the process), dequantized to float32
in row chunks, renamed as runtime/model/gguf_convert.py names them (llama.cpp's q/k row permutation of `llama` files
undone) and handed over; nothing holds a float copy of the whole model.
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from .gguf_convert import gguf_hf_architecture, hf_tensors

CHUNK_BYTES = 64 << 20  # raw bytes dequantized per step: bounds the float32 temporaries of a large tensor
_LAYER = re.compile(r"blk\.(\d+)\.")


def pread_into(path: pathlib.Path, buf: memoryview, offset: int) -> None:
    """Fill `buf` from `path` at `offset` (pread in a loop: a read may return less)."""
    with open(path, "rb", buffering=0) as f:
        done = 0
        while done < len(buf):
            n = os.preadv(f.fileno(), [buf[done:]], offset + done)
            if n <= 0:
                raise ValueError(f"{path.name}: cut short at byte {offset + done}")
            done += n


@dataclass(frozen=True)
class GGUFTensorInfo:
    """Where one tensor's bytes sit in the file and how to read them."""

    name: str
    qtype: int  # a gguf.GGMLQuantizationType value
    shape: tuple[int, ...]  # the reader's numpy shape of the raw data (rows, bytes per row for quantized types)
    dtype: np.dtype  # numpy dtype of the raw data (uint8 for quantized types)
    offset: int
    nbytes: int


class GGUFWeights:
    """The tensors of one GGUF file, grouped by decoder layer, read on demand in HF names (float32 torch tensors)."""

    def __init__(self, path: str | os.PathLike, config: dict, index: dict | None = None):
        self.path = pathlib.Path(path)
        self.config = config
        index = index or tensor_index(self.path)  # parsing the header (tokenizer arrays) takes seconds: cached
        self.arch, self.hf_arch = index["gguf_arch"], index["hf_arch"]
        self.infos = [GGUFTensorInfo(name, qtype, tuple(shape), np.dtype(dtype), offset, nbytes)
                      for name, qtype, shape, dtype, offset, nbytes in index["tensors"]]

    def layer_of(self, info: GGUFTensorInfo) -> int | None:
        """The decoder layer a tensor belongs to, or None (embedding, final norm, output)."""
        m = _LAYER.match(info.name)
        return int(m.group(1)) if m else None

    def groups(self) -> dict[int | None, list[GGUFTensorInfo]]:
        """Tensors by layer (None: the top-level ones)."""
        out: dict[int | None, list[GGUFTensorInfo]] = {}
        for info in self.infos:
            out.setdefault(self.layer_of(info), []).append(info)
        return out

    def read(self, info: GGUFTensorInfo) -> np.ndarray:
        """One tensor dequantized to float32 in HF's [out, in] order (row chunks bound the temporaries)."""
        import gguf

        raw = np.empty(info.shape, dtype=info.dtype)
        pread_into(self.path, memoryview(raw.reshape(-1).view(np.uint8)), info.offset)
        qtype = gguf.GGMLQuantizationType(info.qtype)
        if qtype == gguf.GGMLQuantizationType.F32:
            return raw
        rows = raw.reshape(-1, raw.shape[-1]) if raw.ndim > 1 else raw.reshape(1, -1)
        step = max(1, CHUNK_BYTES // max(1, rows.shape[1] * rows.itemsize))
        first = gguf.quants.dequantize(rows[:step], qtype)
        if step >= rows.shape[0]:
            out = first
        else:  # each chunk straight into the result: no list of parts beside a concatenated copy (2x the tensor)
            out = np.empty((rows.shape[0], first.shape[1]), dtype=first.dtype)
            out[:step] = first
            del first
            for i in range(step, rows.shape[0], step):
                out[i:i + step] = gguf.quants.dequantize(rows[i:i + step], qtype)
        return out.reshape(*raw.shape[:-1], out.shape[-1]) if raw.ndim > 1 else out.reshape(-1)

    def tensors(self, infos: list[GGUFTensorInfo]) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, float32 tensor) for each GGUF tensor of `infos` (an expert stack gives one per expert)."""
        for info in infos:
            yield from hf_tensors(self.arch, self.hf_arch, info.name, self.read(info), self.config)


def tensor_index(path: pathlib.Path) -> dict:
    """What the loader needs of a GGUF's header, as JSON-able values: architectures and each tensor's place."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    return {"gguf_arch": reader.fields["general.architecture"].contents(), "hf_arch": gguf_hf_architecture(path, reader),
            "tensors": [[t.name, int(t.tensor_type), [int(d) for d in t.data.shape], t.data.dtype.str,
                         int(t.data_offset), int(t.n_bytes)] for t in reader.tensors]}


def gguf_weights_of(folder: str | os.PathLike) -> pathlib.Path | None:
    """The GGUF whose weights a converted folder reads (its sglpy_source.json says `weights: gguf`), else None."""
    import json

    src = pathlib.Path(folder) / "sglpy_source.json"
    if not src.is_file():
        return None
    meta = json.loads(src.read_text())
    path = meta.get("gguf")
    return pathlib.Path(path) if meta.get("weights") == "gguf" and path and pathlib.Path(path).is_file() else None
