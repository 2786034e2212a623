"""A vision model's image preprocessing (the folder's own HF image processor config: resize, normalize, patching,
run by transformers' PIL backend) and the expansion of a prompt's image placeholders into image tokens.

Each image's tokens carry one id outside the vocabulary derived from a hash of its preprocessed pixels (as SGLang's
pad values do): the radix cache then keys an image's KV by its content, so the same image shares its cached prefix
across requests and two different images never match. The model embeds those positions from the vision encoder.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from ..images import IMAGE_ID_BASE as PAD_BASE  # image token ids start here (int64-safe, past any vocab)
from .mrope import MRopePositions, mrope_positions

# the text a prompt holds where an image goes, per architecture (what the HF chat templates emit)
PLACEHOLDERS = {
    "LlavaForConditionalGeneration": "<image>",
    "Qwen2VLForConditionalGeneration": "<|vision_start|><|image_pad|><|vision_end|>",
    "Qwen2_5_VLForConditionalGeneration": "<|vision_start|><|image_pad|><|vision_end|>",
}


@dataclass(frozen=True)
class ImageItem:
    """One preprocessed image of a prompt, and where its tokens sit."""

    key: int  # 52-bit hash of the preprocessed pixels and their grid
    pixels: np.ndarray  # LLaVA: [3, H, W]; Qwen2-VL: [patches, 3 * t * p * p] (float32)
    grid: tuple[int, int, int] | None  # Qwen2-VL: (t, h, w) in patches; None for LLaVA
    num_tokens: int
    start: int  # index of its first token in the prompt

    @property
    def pad_id(self) -> int:
        """The id every token of this image carries in the prompt (outside the vocabulary)."""
        return PAD_BASE + self.key

    @property
    def end(self) -> int:
        return self.start + self.num_tokens


@dataclass(frozen=True)
class MultimodalInputs:
    """A prompt's images (in order) and, for M-RoPE models, its positions."""

    images: tuple[ImageItem, ...]
    mrope: MRopePositions | None = None


def is_image_id(token: int) -> bool:
    """True for an image token's id (outside every vocabulary)."""
    return token >= PAD_BASE


def content_key(pixels: np.ndarray, grid) -> int:
    """52-bit hash of an image's preprocessed pixels (and grid)."""
    h = hashlib.blake2b(np.ascontiguousarray(pixels).tobytes(), digest_size=8)
    h.update(repr((pixels.shape, grid)).encode())
    return int.from_bytes(h.digest(), "little") >> 12


class VisionProcessor:
    """Preprocesses images for one vision model folder and lays out their tokens in a prompt."""

    def __init__(self, folder: str, config, tokens_per_image: int | None):
        from transformers import AutoImageProcessor

        self.arch = config.architectures[0]
        self.placeholder = PLACEHOLDERS[self.arch]
        self.image_token_id = int(getattr(config, "image_token_id", None) if getattr(config, "image_token_id", None)
                                  is not None else config.image_token_index)
        self.qwen = self.arch in ("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration")
        self.merge = config.vision_config.spatial_merge_size if self.qwen else 1
        self.tokens_per_image = tokens_per_image
        # the PIL backend: no torchvision needed, and it is the reference transformers tests its fast path against
        self.hf = AutoImageProcessor.from_pretrained(folder, backend="pil")

    def preprocess(self, images: list) -> list[tuple[np.ndarray, tuple[int, int, int] | None, int]]:
        """(pixels, grid, token count) of each PIL image."""
        if not images:
            return []
        out = self.hf(images=[im.convert("RGB") for im in images], return_tensors="np")
        pixels = np.asarray(out["pixel_values"], dtype=np.float32)
        if not self.qwen:
            return [(pixels[i], None, self.tokens_per_image) for i in range(len(images))]
        grids = [tuple(int(v) for v in g) for g in out["image_grid_thw"]]
        res, at = [], 0
        for g in grids:
            n = g[0] * g[1] * g[2]
            res.append((pixels[at:at + n], g, n // self.merge ** 2))
            at += n
        return res

    def expand(self, ids: list[int], images: list) -> tuple[list[int], MultimodalInputs]:
        """The prompt with each image placeholder token replaced by the image's tokens, and its images.
        ValueError when the placeholders and the images do not pair up."""
        marks = [i for i, t in enumerate(ids) if t == self.image_token_id]
        if len(marks) != len(images):
            raise ValueError(f"the prompt has {len(marks)} image placeholder(s) ({self.placeholder!r}) for "
                             f"{len(images)} image(s)")
        out, items, at = [], [], 0
        for mark, (pixels, grid, n) in zip(marks, self.preprocess(images)):
            out.extend(ids[at:mark])
            item = ImageItem(content_key(pixels, grid), pixels, grid, n, len(out))
            out.extend([item.pad_id] * n)
            items.append(item)
            at = mark + 1
        out.extend(ids[at:])
        mrope = None
        if self.qwen:
            mrope = mrope_positions(len(out), [(it.start, it.end) for it in items], [it.grid for it in items],
                                    self.merge)
        return out, MultimodalInputs(tuple(items), mrope)


def attach_images(req, image_data: tuple[bytes, ...], processor: VisionProcessor | None, limits, image_limits,
                  max_new_tokens_unset: bool):
    """A built request (placeholders as tokens) with its images decoded, preprocessed and laid out; its length is
    checked again (images add tokens) and a max_new_tokens left unset fills the context as for text."""
    import dataclasses

    from ..images import check_image

    if processor is None:
        raise ValueError("this model reads no images (a text-only model): send the prompt without image_data")
    if len(image_data) > image_limits.max_images:
        raise ValueError(f"{len(image_data)} images in one prompt, over the limit of {image_limits.max_images}")
    images = [check_image(b, image_limits) for b in image_data]
    ids, mm = processor.expand(req.input_ids, images)
    logprob = req.logprob
    if logprob.return_logprob and logprob.logprob_start_len >= 0:
        # counted in the prompt as given (one placeholder token per image): scored positions lie after the images
        last = max(i for i, t in enumerate(req.input_ids) if t == processor.image_token_id)
        if logprob.logprob_start_len <= last:
            raise ValueError(f"prompt logprobs must start after the last image (logprob_start_len > {last}); image "
                             "tokens have no logprobs")
        logprob = dataclasses.replace(logprob, logprob_start_len=logprob.logprob_start_len + len(ids)
                                      - len(req.input_ids))
    n, context = len(ids), limits.context_len
    if n >= context or n >= limits.kv_slots:
        raise ValueError(f"the prompt with its images has {n} tokens, which does not fit the model's context of "
                         f"{context} tokens (or the KV pool's {limits.kv_slots})")
    sp = req.sampling
    if n + sp.max_new_tokens > context:
        if max_new_tokens_unset:  # it filled the context before the images were laid out
            sp = dataclasses.replace(sp, max_new_tokens=context - n)
        else:
            raise ValueError(f"the prompt with its images ({n} tokens) plus max_new_tokens ({sp.max_new_tokens}) "
                             f"exceeds the model's context of {context} tokens")
    return dataclasses.replace(req, input_ids=ids, sampling=sp, logprob=logprob, mm=mm)
