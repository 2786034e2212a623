"""Image inputs: every form the APIs accept, and the hostile ones refused by name before any engine work."""

import base64
import io
import struct
import zlib

import pytest
from PIL import Image

from sglpy.runtime.images import ImageLimits, check_image, image_bytes, image_list


def png(w=8, h=6, color=(200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), color).save(buf, format="PNG")
    return buf.getvalue()


def huge_header_png(w=100_000, h=100_000) -> bytes:
    """A PNG whose header declares w x h pixels, with almost no data behind it."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + chunk(b"IEND", b"")


LIMITS = ImageLimits()


def test_every_accepted_form_gives_the_same_bytes(tmp_path):
    data = png()
    b64 = base64.b64encode(data).decode()
    assert image_bytes(data, LIMITS) == data
    assert image_bytes(b64, LIMITS) == data
    assert image_bytes("data:image/png;base64," + b64, LIMITS) == data
    pil = image_bytes(Image.open(io.BytesIO(data)), LIMITS)
    assert Image.open(io.BytesIO(pil)).tobytes() == Image.open(io.BytesIO(data)).tobytes()
    path = tmp_path / "a.png"
    path.write_bytes(data)
    with pytest.raises(ValueError, match="file paths are not read"):
        image_bytes(str(path), LIMITS)
    assert image_bytes(str(path), ImageLimits(allow_paths=True)) == data
    assert image_list(None, LIMITS) is None
    assert image_list([data, b64], LIMITS) == [data, data]


@pytest.mark.parametrize("bad, why", [
    (png(64, 64)[:60], "corrupt or truncated"),
    (huge_header_png(), "pixels"),
    (b"%PDF-1.4 not an image at all", "not an image"),
    (b"", "empty"),
    ("http://example.com/cat.png", "URLs"),
    ("data:image/png;base64,@@@@", "not valid base64"),
    ("data:image/png,rawbytes", "must be base64"),
    (12345, "must be bytes"),
])
def test_hostile_images_are_refused_by_name(bad, why):
    with pytest.raises(ValueError, match=why):
        image_bytes(bad, LIMITS)


def test_limits_on_bytes_pixels_and_count():
    with pytest.raises(ValueError, match="bytes, over the limit of 20"):
        check_image(png(), ImageLimits(max_bytes=20))
    with pytest.raises(ValueError, match=r"8x6 pixels \(48\), over the limit of 40"):
        check_image(png(), ImageLimits(max_pixels=40))
    with pytest.raises(ValueError, match="3 images in one prompt, over the limit of 2"):
        image_list([png()] * 3, ImageLimits(max_images=2))
    with pytest.raises(ValueError, match="must be positive"):
        ImageLimits(max_images=0)
