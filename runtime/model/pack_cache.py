"""Packed weights on disk: a GGUF model's quantized projections and head, packed once per machine and read back on
every later load (the default model's load: 16.7 s of CPU packing, 3.1 s reading them back; 2-vCPU Sapphire Rapids).

An entry is a folder under $SGLPY_CACHE/packed named after its key: the GGUF's identity (resolved path, size,
mtime), what was asked for (quantization, dense copies), how this machine packs (native layout, dense dtype), and
the packing code itself (a hash of its source files and torch's version), so that any change to any of them packs
afresh. The folder holds `weights.safetensors` and `meta.json` (the layers' PackedLinear fields, the quantization
mode that ran, the weights file's sha256); it is written beside its place and renamed into it (a half-written entry
is never visible), and an entry whose checksum or layout does not match is packed again and replaced.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import shutil
import tempfile
import time
from dataclasses import dataclass

import torch

from sglpy.kernels.cpu_native import native_lib
from sglpy.kernels.quant_linear import PackedLinear

logger = logging.getLogger(__name__)

FORMAT = 1
ENV_DISABLE = "SGLPY_NO_PACK_CACHE"  # set (not "0"): every load packs and nothing is written
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_FIELDS = ("qweight", "scales", "dense", "bias")


def _packing_code_hash() -> str:
    """The packing code's version: its source files (a change to any of them packs every model again) and torch's."""
    from sglpy.kernels import quant_linear, quant_linear_cpu

    from . import quantization

    h = hashlib.sha256(torch.__version__.encode())
    for module in (quant_linear, quant_linear_cpu, quantization):
        h.update(pathlib.Path(module.__file__).read_bytes())
    h.update(pathlib.Path(__file__).read_bytes())
    return h.hexdigest()


def _file_sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _dtype_name(dtype: torch.dtype | None) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class PackKey:
    """Everything an entry's bytes follow from."""

    gguf: str  # resolved path
    size: int
    mtime_ns: int
    requested: str  # quantization asked for: auto, int8 or int4
    keep_dense: bool
    native: bool  # the native kernels' layout (else torch's packed one)
    dense_dtype: str  # dense_copy_dtype(): the many-row calls' dtype (tiles or copies)
    code: str  # _packing_code_hash()

    def folder_name(self) -> str:
        digest = hashlib.sha256(json.dumps(self.__dict__, sort_keys=True).encode()).hexdigest()[:16]
        return f"{pathlib.Path(self.gguf).stem}-{self.requested}-{digest}"


def cache_folder() -> pathlib.Path:
    """$SGLPY_CACHE/packed (the conversion cache's folder)."""
    from .loader import cache_root

    return cache_root() / "packed"


class PackCache:
    """One model's packed weights: `layer(i)` / `head()` give what an earlier load packed (None: pack it now and
    `record` it); `save()` writes the entry once every layer is in, when it was not on disk."""

    def __init__(self, key: PackKey, folder: pathlib.Path):
        self.key, self.folder = key, folder
        self.mode: str | None = None  # the quantization that ran (int8/int4), from the entry when there is one
        self.hit = False
        self._packed: dict[str, PackedLinear] = {}  # "head" or "layers.<i>.<proj>" -> packed weights
        self._recorded: dict[str, PackedLinear] = {}
        self._read()

    @classmethod
    def open(cls, model_path: str, requested: str, device: torch.device, keep_dense: bool) -> PackCache | None:
        """The cache entry of a GGUF-backed model folder (None: nothing to cache: not CPU, no packing, no GGUF)."""
        from .gguf_weights import gguf_weights_of
        from .quantization import dense_copy_dtype

        if os.environ.get(ENV_DISABLE, "") not in ("", "0") or device.type != "cpu" or requested == "none":
            return None
        gguf = gguf_weights_of(model_path)
        if gguf is None:
            return None
        st = gguf.stat()
        key = PackKey(str(gguf.resolve()), st.st_size, st.st_mtime_ns, requested, keep_dense,
                      native_lib() is not None, _dtype_name(dense_copy_dtype()), _packing_code_hash())
        return cls(key, cache_folder() / key.folder_name())

    def _read(self) -> None:
        meta_file, weights_file = self.folder / "meta.json", self.folder / "weights.safetensors"
        if not meta_file.is_file():
            return
        try:
            meta = json.loads(meta_file.read_text())
            if meta.get("format") != FORMAT or meta.get("key") != self.key.__dict__:
                raise ValueError("made for another model or packing code")
            if _file_sha256(weights_file) != meta["sha256"]:
                raise ValueError("weights.safetensors does not match its checksum")
            from safetensors.torch import load_file

            tensors = load_file(weights_file)
            packed = {name: _unpack(name, m, tensors) for name, m in meta["linears"].items()}
        except Exception as e:  # noqa: BLE001 - any damage means: pack again, and replace the entry
            logger.warning("packed weights cache %s is unusable (%s): packing again", self.folder, e)
            return
        self._packed, self.mode, self.hit = packed, meta["mode"], True

    def layer(self, index: int) -> dict[str, PackedLinear] | None:
        """A decoder layer's packed projections by name, or None."""
        prefix = f"layers.{index}."
        found = {k[len(prefix):]: p for k, p in self._packed.items() if k.startswith(prefix)}
        return found or None

    def head(self) -> PackedLinear | None:
        """The packed lm_head, or None."""
        return self._packed.get("head")

    def record(self, name: str, packed: PackedLinear) -> None:
        """What this load packed ("head" or "layers.<i>.<proj>"), for save()."""
        self._recorded[name] = packed

    def save(self, mode: str) -> bool:
        """Write the recorded weights as this key's entry (atomically); False when there was nothing to write."""
        if self.hit or not self._recorded:
            return False
        root = self.folder.parent
        root.mkdir(parents=True, exist_ok=True)
        _prune(root)
        tmp = pathlib.Path(tempfile.mkdtemp(prefix=self.folder.name + ".tmp", dir=root))
        try:
            from safetensors.torch import save_file

            tensors, linears = {}, {}
            for name, p in self._recorded.items():
                linears[name] = {"kind": p.kind, "out_features": p.out_features, "in_features": p.in_features,
                                 "group_size": p.group_size, "native": p.native, "tiles": _dtype_name(p.tiles)}
                for field in _FIELDS:
                    t = getattr(p, field)
                    if t is not None:
                        tensors[f"{name}.{field}"] = t.contiguous()
            save_file(tensors, tmp / "weights.safetensors")
            meta = {"format": FORMAT, "key": self.key.__dict__, "mode": mode, "linears": linears,
                    "sha256": _file_sha256(tmp / "weights.safetensors")}
            (tmp / "meta.json").write_text(json.dumps(meta))
            if self.folder.exists():  # an unusable entry (checked in _read), or another process's just now
                shutil.rmtree(self.folder, ignore_errors=True)
            try:
                tmp.rename(self.folder)
            except OSError:  # another process renamed its (equal) entry in between: keep that one
                return False
        except OSError as e:  # a full or read-only disk costs the next load its packing time, nothing else
            logger.warning("could not write the packed weights cache %s: %s", self.folder, e)
            return False
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return True


def _unpack(name: str, m: dict, tensors: dict[str, torch.Tensor]) -> PackedLinear:
    fields = {f: tensors.get(f"{name}.{f}") for f in _FIELDS}
    if fields["qweight"] is None or fields["scales"] is None:
        raise ValueError(f"{name} lacks its packed weight or scales")
    return PackedLinear(m["kind"], m["out_features"], m["in_features"], fields["qweight"], fields["scales"],
                        m["group_size"], fields["dense"], fields["bias"], m["native"],
                        None if m["tiles"] is None else _DTYPES[m["tiles"]])


def _prune(root: pathlib.Path, stale_s: float = 3600.0) -> None:
    """Drop entries whose GGUF is gone (models built in temporary folders) and writes abandoned over an hour ago."""
    now = time.time()
    for entry in root.iterdir():
        try:
            if ".tmp" in entry.name:
                if now - entry.stat().st_mtime > stale_s:
                    shutil.rmtree(entry, ignore_errors=True)
                continue
            gguf = json.loads((entry / "meta.json").read_text())["key"]["gguf"]
            if not pathlib.Path(gguf).exists():
                shutil.rmtree(entry, ignore_errors=True)
        except (OSError, ValueError, KeyError, TypeError):
            continue
