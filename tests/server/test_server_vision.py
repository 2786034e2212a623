"""A vision model over HTTP: /generate image_data (base64, data URL, a list per prompt, batches), OpenAI image_url
parts, the frontend's RuntimeEndpoint with sgl.image, hostile images as 400s naming the problem (the server keeps
serving), and a repeated image's tokens reported as cached."""

import base64
import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

import sglpy as sgl
from sglpy.runtime.testing.server_harness import run_server
from sglpy.runtime.testing.tiny_vlm import make_tiny_llava


def png_bytes(seed: int, w: int = 40, h: int = 60) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def huge_header_png() -> bytes:
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + chunk(b"IEND", b"")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = make_tiny_llava(tmp_path_factory.mktemp("vlm") / "llava")
    with run_server("--model", path, "--quantization", "none", "--max-total-tokens", "4096") as s:
        yield s


SP = {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}


def test_generate_with_images_and_cached_repeat(server):
    img = png_bytes(1)
    info = server.get("/get_model_info").json()
    assert info["has_image_understanding"] is True and info["image_placeholder"] == "<image>"
    first = server.post("/generate", {"text": "<image> Describe.", "image_data": b64(img), "sampling_params": SP})
    assert first.status_code == 200, first.text
    again = server.post("/generate", {"text": "<image> Describe.", "sampling_params": SP,
                                      "image_data": "data:image/png;base64," + b64(img)})
    assert again.json()["output_ids"] == first.json()["output_ids"]
    assert again.json()["meta_info"]["cached_tokens"] >= 16  # the image's 16 tokens came from the radix cache
    two = server.post("/generate", {"text": "<image> and <image>", "image_data": [b64(img), b64(png_bytes(2))],
                                    "sampling_params": SP})
    assert two.status_code == 200, two.text
    batch = server.post("/generate", {"text": ["<image> Describe.", "no image"], "image_data": [b64(img), None],
                                      "sampling_params": SP})
    assert batch.json()[0]["output_ids"] == first.json()["output_ids"]


@pytest.mark.parametrize("bad, why", [
    (b64(png_bytes(3)[:80]), "corrupt or truncated"),
    (b64(huge_header_png()), "pixels"),
    (b64(b"GIF89a but not really an image"), "not an image"),
    ("http://example.com/a.png", "URLs"),
    ("/etc/hostname", "file paths are not read"),
])
def test_hostile_images_are_400s_and_the_server_keeps_serving(server, bad, why):
    r = server.post("/generate", {"text": "<image> x", "image_data": bad, "sampling_params": SP})
    assert r.status_code == 400, r.text
    assert why in r.json()["error"]["message"]
    ok = server.post("/generate", {"text": "<image> x", "image_data": b64(png_bytes(4)), "sampling_params": SP})
    assert ok.status_code == 200


def test_openai_image_url_parts(server):
    url = "data:image/png;base64," + b64(png_bytes(5))
    body = {"model": "m", "max_tokens": 5, "temperature": 0, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What is this?"}]}]}
    r = server.post("/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] is not None
    body["messages"][0]["content"][0]["image_url"]["url"] = "https://example.com/cat.png"
    r = server.post("/v1/chat/completions", body)
    assert r.status_code == 400 and "URLs" in r.json()["error"]["message"]


def test_frontend_program_over_http(server):
    backend = sgl.RuntimeEndpoint(server.url)

    @sgl.function
    def describe(s, img):
        s += sgl.user(sgl.image(img) + "What is in the picture?")
        s += sgl.assistant(sgl.gen("answer", max_tokens=5, temperature=0, ignore_eos=True))
        s += sgl.user("Kind?")
        s += sgl.assistant(sgl.select("kind", ["receipt", "photo"]))

    img = png_bytes(6)
    state = describe.run(img=img, backend=backend)
    prompt = state.text()[:state.text().index(state["answer"])]
    direct = server.post("/generate", {"text": prompt, "image_data": b64(img), "sampling_params": SP}).json()
    assert state["answer"] == direct["text"]
    assert state["kind"] in ("receipt", "photo")
