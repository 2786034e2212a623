"""sgl.image in programs on a tiny LLaVA, in process (sgl.Engine): inside roles, run, run_batch, fork and select;
each answer equals the runtime's own answer for the same prompt and image."""

import numpy as np
import pytest
from PIL import Image

import sglpy as sgl
from sglpy.runtime.testing.tiny_vlm import make_tiny_llava


def picture(seed: int, w: int = 40, h: int = 60) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    be = sgl.Engine(make_tiny_llava(tmp_path_factory.mktemp("vlm") / "llava"), quantization="none",
                    max_total_tokens=4096)
    yield be
    be.shutdown()


@sgl.function
def describe(s, img):
    s += sgl.user(sgl.image(img) + "What is in the picture?")
    s += sgl.assistant(sgl.gen("answer", max_tokens=6, temperature=0, ignore_eos=True))


def prompt_of(state) -> str:
    return state.text()[:state.text().rindex(state["answer"])]


def test_image_program_in_process(backend, tmp_path):
    img = picture(1)
    path = tmp_path / "pic.png"
    img.save(path)
    state = describe.run(img=str(path), backend=backend)  # a path, read by the program
    direct = backend.engine.generate(prompt_of(state), {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True},
                                     image_data=img)
    assert state["answer"] == direct["text"]
    assert "<image>" in state.text()
    # bytes and a PIL image give the same answer
    assert describe.run(img=path.read_bytes(), backend=backend)["answer"] == state["answer"]
    states = describe.run_batch([{"img": img}, {"img": picture(2)}], backend=backend)
    assert states[0]["answer"] == state["answer"]
    other = backend.engine.generate(prompt_of(states[1]), {"max_new_tokens": 6, "temperature": 0,
                                                           "ignore_eos": True}, image_data=picture(2))
    assert states[1]["answer"] == other["text"]


def test_fork_over_one_image_and_select(backend):
    @sgl.function
    def fields(s, img):
        s += sgl.user(sgl.image(img) + "Fill the form.")
        forks = s.fork(2)
        for f, name in zip(forks, ("store", "date")):
            f += sgl.assistant(name + ": " + sgl.gen("v", max_tokens=4, temperature=0, ignore_eos=True))
        s["store"], s["date"] = forks[0]["v"], forks[1]["v"]
        s += sgl.assistant("Kind: " + sgl.select("kind", ["receipt", "invoice", "photo"]))

    backend.flush_cache()
    state = fields.run(img=picture(3), backend=backend)
    assert state["kind"] in ("receipt", "invoice", "photo")
    assert isinstance(state["store"], str) and isinstance(state["date"], str)
    info = backend.get_server_info()
    assert info["vision"]["images_encoded"] >= 1
    assert info["cached_tokens"] > 0  # the image's tokens were computed once and shared by the forks


def test_text_only_backends_refuse_sgl_image_by_name():
    from sglpy.backend_fake import FakeBackend

    @sgl.function
    def prog(s):
        s += sgl.user(sgl.image(b"\x89PNG") + "hi")
        s += sgl.assistant(sgl.gen("a", max_tokens=2))

    with pytest.raises(Exception, match="needs a vision model"):
        prog.run(backend=FakeBackend(responses=["x"]))["a"]
    with pytest.raises(TypeError, match="sgl.image takes"):
        sgl.image(12)


def test_receipt_example_gives_schema_valid_json(backend):
    import pathlib
    import re
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
    try:
        import receipt_extraction
    finally:
        sys.path.pop(0)
    obj = receipt_extraction.main(backend)
    assert set(obj) == {"store", "date", "items", "total"}
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", obj["date"]) and re.fullmatch(r"\d{1,4}\.\d{2}", obj["total"])
