"""A model's weight files read one decoder layer at a time (safetensors shards or a GGUF), by pread.

Reading with pread instead of a memory map keeps the files' pages in the page cache, out of the process's resident
memory: the loader holds one layer's float weights at a time (runtime/model/loader.py), and the peak is about the
packed model, not the float checkpoint beside it.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
from collections.abc import Iterator

import torch

from .gguf_weights import GGUFWeights, gguf_weights_of, pread_into

_LAYER = re.compile(r"model\.layers\.(\d+)\.")
_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool}


class SafetensorsWeights:
    """Every *.safetensors file of a folder: tensor names from the headers, each tensor read on demand."""

    def __init__(self, folder: str | os.PathLike):
        self.where: dict[str, tuple[pathlib.Path, str, list[int], int, int]] = {}
        for path in sorted(pathlib.Path(folder).glob("*.safetensors")):
            with open(path, "rb") as f:
                size = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(size))
            for name, h in header.items():
                if name == "__metadata__":
                    continue
                start, end = h["data_offsets"]
                self.where[name] = (path, h["dtype"], h["shape"], 8 + size + start, end - start)

    def groups(self) -> dict[int | None, list[str]]:
        """Tensor names by decoder layer (None: the others)."""
        out: dict[int | None, list[str]] = {}
        for name in self.where:
            m = _LAYER.match(name)
            out.setdefault(int(m.group(1)) if m else None, []).append(name)
        return out

    def tensors(self, names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
        for name in names:
            path, dtype, shape, offset, nbytes = self.where[name]
            if dtype not in _ST_DTYPES:
                raise ValueError(f"{path.name}: tensor {name!r} has dtype {dtype}, which the loader does not read")
            raw = torch.empty(nbytes, dtype=torch.uint8)
            pread_into(path, memoryview(raw.numpy()), offset)
            yield name, raw.view(_ST_DTYPES[dtype]).reshape(shape)


def open_weights(folder: str | os.PathLike, config) -> SafetensorsWeights | GGUFWeights:
    """The weights of a model folder: the GGUF its conversion points at (sglpy_source.json), else its safetensors."""
    gguf = gguf_weights_of(folder)
    if gguf is not None:
        index = json.loads((pathlib.Path(folder) / "sglpy_source.json").read_text()).get("index")
        return GGUFWeights(gguf, config.to_dict(), index)
    files = sorted(pathlib.Path(folder).glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors in {folder}")
    return SafetensorsWeights(folder)


def layer_order(num_layers: int) -> list[int]:
    """The order layers are loaded in: the first and the last before the rest, so that quantization 'auto' can
    judge them (runtime/model/quantization.py: int4_loses_nothing) before any layer is packed."""
    return [0] + ([num_layers - 1] if num_layers > 1 else []) + list(range(1, num_layers - 1))
