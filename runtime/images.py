"""Image inputs as the APIs take them (raw bytes, base64, data URLs, PIL images, server paths behind a flag), checked
against the limits and decoded before any engine work: a corrupt, oversized or non-image input is a ValueError that
names the problem (the server answers it with a 400, the engine never sees it). Torch-free: the server process
runs it."""

from __future__ import annotations

import base64
import binascii
import io
import os
import warnings
from dataclasses import dataclass

FORMATS = "PNG, JPEG, GIF, BMP, WebP, TIFF"
# A prompt's image tokens carry ids from here up (model/image_processor.py): far above any vocabulary, below 2**63
IMAGE_ID_BASE = 1 << 52


def text_ids(ids: list[int]) -> list[int]:
    """The ids of `ids` that are text tokens (image tokens have no text)."""
    return [t for t in ids if t < IMAGE_ID_BASE]


@dataclass(frozen=True)
class ImageLimits:
    """What one image and one request may hold."""

    max_bytes: int = 20 * 1024 * 1024  # encoded size of one image
    max_pixels: int = 40_000_000  # width x height of one image (as its header declares it)
    max_images: int = 16  # images in one prompt
    allow_paths: bool = False  # read server-side file paths (a server flag; never for remote clients by default)

    def __post_init__(self):
        for name in ("max_bytes", "max_pixels", "max_images"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


def _from_string(s: str, limits: ImageLimits) -> bytes:
    if s.startswith(("http://", "https://")):
        raise ValueError("image URLs (http/https) are refused: the server makes no outbound requests; send the image "
                         "as a base64 data URL")
    if s.startswith("data:"):
        head, sep, payload = s.partition(",")
        if not sep or ";base64" not in head:
            raise ValueError("an image data URL must be base64 (data:image/png;base64,...)")
        return _b64(payload, limits, strict=True)
    if not s.startswith("file://"):
        data = _b64(s, limits, strict=False)
        if data is not None:
            return data
    path = s[len("file://"):] if s.startswith("file://") else s
    if not limits.allow_paths:
        raise ValueError("image string is not base64, and image file paths are not read by this server (start it "
                         "with --allow-image-paths); send the image as base64 or a data URL")
    if not os.path.isfile(path):
        raise ValueError(f"image file {path!r} does not exist")
    size = os.path.getsize(path)
    if size > limits.max_bytes:
        raise ValueError(f"image file {path!r} has {size} bytes, over the limit of {limits.max_bytes}")
    with open(path, "rb") as f:
        return f.read()


def _b64(s: str, limits: ImageLimits, strict: bool) -> bytes | None:
    """Base64 payload -> bytes (None when not base64 and not strict)."""
    if len(s) * 3 // 4 > limits.max_bytes + 3:
        raise ValueError(f"image has about {len(s) * 3 // 4} bytes, over the limit of {limits.max_bytes}")
    try:
        return base64.b64decode("".join(s.split()), validate=True)
    except (binascii.Error, ValueError):
        if strict:
            raise ValueError("image data URL payload is not valid base64") from None
        return None


def image_bytes(source, limits: ImageLimits) -> bytes:
    """The encoded bytes of one image source (bytes, base64 / data URL string, path when allowed, PIL image),
    checked by check_image. ValueError names the problem."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    elif isinstance(source, str):
        data = _from_string(source.strip(), limits)
    elif hasattr(source, "save") and hasattr(source, "size"):  # a PIL image: sent as PNG
        buf = io.BytesIO()
        source.save(buf, format="PNG")
        data = buf.getvalue()
    else:
        raise ValueError(f"an image must be bytes, a base64 or data-URL string or a PIL image, got "
                         f"{type(source).__name__}")
    check_image(data, limits)
    return data


def check_image(data: bytes, limits: ImageLimits):
    """Decode and return the PIL image of `data` after checking its byte size and its declared pixel count."""
    from PIL import Image

    if len(data) > limits.max_bytes:
        raise ValueError(f"image has {len(data)} bytes, over the limit of {limits.max_bytes}")
    if not data:
        raise ValueError("image is empty (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data))
            w, h = im.size
            if w * h > limits.max_pixels:
                raise ValueError(f"image is {w}x{h} pixels ({w * h}), over the limit of {limits.max_pixels} pixels")
            im.load()  # a truncated or corrupt body fails here, not in the engine
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ValueError(f"image declares too many pixels: {e}") from None
    except Image.UnidentifiedImageError:
        raise ValueError(f"not an image (or not a format we read: {FORMATS})") from None
    except (OSError, SyntaxError, EOFError) as e:
        raise ValueError(f"image data is corrupt or truncated: {e}") from None
    if w < 1 or h < 1:
        raise ValueError(f"image has no pixels ({w}x{h})")
    return im


def image_list(image_data, limits: ImageLimits) -> list[bytes] | None:
    """One prompt's image_data (one source or a list; None or [] for none) as checked bytes."""
    if image_data is None:
        return None
    items = image_data if isinstance(image_data, (list, tuple)) else [image_data]
    if len(items) > limits.max_images:
        raise ValueError(f"{len(items)} images in one prompt, over the limit of {limits.max_images}")
    return [image_bytes(s, limits) for s in items] or None
