"""Vision-language models against transformers on tiny random weights (float32): LLaVA (CLIP tower) and Qwen2-VL
(M-RoPE, dynamic resolution), one and two images per prompt; image tokens in the radix cache and the encoder cache;
chunked prefill across an image; constrained decoding after image tokens."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from sglpy.runtime.testing.tiny_vlm import make_tiny_llava, make_tiny_qwen2_vl

QWEN_PH = "<|vision_start|><|image_pad|><|vision_end|>"
N = 10  # greedy tokens compared


def picture(seed: int, w: int, h: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))


IMAGES = [picture(1, 40, 60), picture(2, 90, 50)]


@pytest.fixture(scope="module", params=["llava", "qwen2_vl"])
def family(request, tmp_path_factory):
    """(name, folder, placeholder, engine) of one family; the engine lives for the module."""
    from sglpy.runtime.engine import Engine

    folder = tmp_path_factory.mktemp("vlm")
    path = make_tiny_llava(folder / "llava") if request.param == "llava" else make_tiny_qwen2_vl(folder / "qwen")
    eng = Engine(path, quantization="none", max_total_tokens=4096, chunked_prefill_size=512)
    yield request.param, path, "<image>" if request.param == "llava" else QWEN_PH, eng
    eng.shutdown()


def hf_reference(name: str, path: str, prompt: str, images: list, n: int):
    """transformers' greedy ids and first-step log-probabilities for the prompt with its placeholders expanded."""
    from transformers import (AutoImageProcessor, AutoTokenizer, LlavaForConditionalGeneration,
                              Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration)

    cls = {"llava": LlavaForConditionalGeneration, "qwen2_vl": Qwen2VLForConditionalGeneration,
           "qwen2_5_vl": Qwen2_5_VLForConditionalGeneration}[name]
    model = cls.from_pretrained(path, dtype=torch.float32).eval()
    pv = AutoImageProcessor.from_pretrained(path, backend="pil")(images=images, return_tensors="pt")
    tid = model.config.image_token_id
    if name == "llava":
        vc = model.config.vision_config
        counts = [(vc.image_size // vc.patch_size) ** 2] * len(images)
    else:
        counts = [int(g.prod()) // 4 for g in pv["image_grid_thw"]]
    ids, it = [], iter(counts)
    for t in AutoTokenizer.from_pretrained(path).encode(prompt):
        ids.extend([t] * next(it) if t == tid else [t])
    x = torch.tensor([ids])
    kw = dict(pixel_values=pv["pixel_values"], attention_mask=torch.ones_like(x))
    if name != "llava":
        kw.update(image_grid_thw=pv["image_grid_thw"], mm_token_type_ids=(x == tid).int())
    with torch.no_grad():
        out = model.generate(x, max_new_tokens=n, do_sample=False, output_scores=True, return_dict_in_generate=True,
                             **kw)
    return out.sequences[0, x.shape[1]:].tolist(), torch.log_softmax(out.scores[0][0].float(), -1), len(ids)


@pytest.mark.parametrize("k", [1, 2])
def test_greedy_equals_transformers(family, k):
    name, path, ph, eng = family
    prompt = "Look: " + " and ".join([ph] * k) + " what is it?"
    ref, logprobs, n_prompt = hf_reference(name, path, prompt, IMAGES[:k], N)
    eng.flush_cache()
    got = eng.generate(prompt, {"max_new_tokens": N, "temperature": 0, "ignore_eos": True}, image_data=IMAGES[:k],
                       return_logprob=True, top_logprobs_num=3)
    assert got["output_ids"] == ref
    assert got["meta_info"]["prompt_tokens"] == n_prompt
    for lp, tok, _ in got["meta_info"]["output_top_logprobs"][0]:  # the first step's top-3, against HF's
        assert abs(lp - float(logprobs[tok])) < 1e-4


def test_same_image_cached_different_images_never_collide(family):
    name, path, ph, eng = family
    eng.flush_cache()
    sp = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    before = eng.get_server_info()["vision"]["images_encoded"]
    a1 = eng.generate(f"{ph} Describe.", sp, image_data=IMAGES[0])
    a2 = eng.generate(f"{ph} Describe.", sp, image_data=IMAGES[0])
    image_tokens = a1["meta_info"]["prompt_tokens"] - len(eng.tokenize(["Describe."])[0]) - 2
    assert a2["output_ids"] == a1["output_ids"]
    assert a2["meta_info"]["cached_tokens"] >= image_tokens  # the image's tokens came from the radix cache
    assert eng.get_server_info()["vision"]["images_encoded"] == before + 1  # and the encoder ran once
    # a different image of the same size and token count: nothing of the image is shared, the answer is its own
    other = picture(7, 40, 60)
    b = eng.generate(f"{ph} Describe.", sp, image_data=other)
    assert b["meta_info"]["cached_tokens"] < image_tokens
    eng.flush_cache()
    fresh = eng.generate(f"{ph} Describe.", sp, image_data=other)
    assert fresh["output_ids"] == b["output_ids"]


def test_chunked_prefill_across_an_image_keeps_the_output(family, tmp_path):
    """Chunks of 5 tokens split every image's tokens; the output equals one prefill's."""
    from sglpy.runtime.engine import Engine

    name, path, ph, eng = family
    prompt = f"A {ph} then {ph} end"
    sp = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    eng.flush_cache()
    whole = eng.generate(prompt, sp, image_data=IMAGES)
    small = Engine(path, quantization="none", max_total_tokens=4096, chunked_prefill_size=5)
    try:
        split = small.generate(prompt, sp, image_data=IMAGES)
        assert split["output_ids"] == whole["output_ids"]
        # a batch mixing text-only and image prompts, continuously batched
        outs = small.generate([prompt, "plain text prompt", f"{ph} alone"], [sp] * 3,
                              image_data=[IMAGES, None, IMAGES[1]])
        assert outs[0]["output_ids"] == whole["output_ids"]
        assert outs[1]["output_ids"] == small.generate("plain text prompt", sp)["output_ids"]
    finally:
        small.shutdown()


def test_constrained_after_image_tokens(family):
    name, path, ph, eng = family
    schema = {"type": "object", "properties": {"kind": {"enum": ["receipt", "photo", "chart"]},
                                               "paid": {"type": "boolean"}},
              "required": ["kind", "paid"], "additionalProperties": False}
    out = eng.generate(f"{ph} Extract as JSON:", {"max_new_tokens": 48, "temperature": 0,
                                                   "json_schema": json.dumps(schema)}, image_data=IMAGES[0])
    doc = json.loads(out["text"])
    assert doc["kind"] in ("receipt", "photo", "chart") and isinstance(doc["paid"], bool)
    pick = eng.generate(f"{ph} Color:", {"max_new_tokens": 8, "temperature": 0, "regex": "(red|green|blue)"},
                        image_data=IMAGES[1])
    assert pick["text"] in ("red", "green", "blue")


def test_bad_images_are_refused_by_name(family):
    name, path, ph, eng = family
    sp = {"max_new_tokens": 2}
    with pytest.raises(ValueError, match="placeholder"):
        eng.generate("no placeholder here", sp, image_data=IMAGES[0])
    with pytest.raises(ValueError, match="not an image"):
        eng.generate(f"{ph} x", sp, image_data=b"definitely not an image")
    assert eng.generate(f"{ph} x", sp, image_data=IMAGES[0])["meta_info"]["finish_reason"] is not None


def test_llava_with_a_siglip_tower_equals_transformers(tmp_path):
    """SigLIP towers (no class token, every patch kept: LLaVA-OneVision / SmolVLM-style) through the same code."""
    from sglpy.runtime.engine import Engine

    path = make_tiny_llava(tmp_path / "siglip", tower="siglip")
    ref, _, n_prompt = hf_reference("llava", path, "<image> What is it?", IMAGES[:1], N)
    eng = Engine(path, quantization="none", max_total_tokens=2048)
    try:
        got = eng.generate("<image> What is it?", {"max_new_tokens": N, "temperature": 0, "ignore_eos": True},
                           image_data=IMAGES[0])
    finally:
        eng.shutdown()
    assert got["output_ids"] == ref and got["meta_info"]["prompt_tokens"] == n_prompt


def test_streaming_with_an_image_ends_with_the_whole_answer(family):
    name, path, ph, eng = family
    sp = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    whole = eng.generate(f"{ph} Tell me.", sp, image_data=IMAGES[1])
    chunks = list(eng.generate(f"{ph} Tell me.", sp, image_data=IMAGES[1], stream=True))
    assert chunks[-1]["text"] == whole["text"] and chunks[-1]["output_ids"] == whole["output_ids"]


def test_qwen2_5_vl_windowed_encoder_equals_transformers(tmp_path):
    """Qwen2.5-VL: windows of 2x2 merged tokens (several per image), full attention in one block, RMSNorm, SwiGLU."""
    from sglpy.runtime.engine import Engine

    path = make_tiny_qwen2_vl(tmp_path / "qwen25", v25=True)
    eng = Engine(path, quantization="none", max_total_tokens=2048)
    try:
        for k in (1, 2):
            prompt = "See " + " and ".join([QWEN_PH] * k) + " now?"
            ref, logprobs, n_prompt = hf_reference("qwen2_5_vl", path, prompt, IMAGES[:k], N)
            got = eng.generate(prompt, {"max_new_tokens": N, "temperature": 0, "ignore_eos": True},
                               image_data=IMAGES[:k], return_logprob=True, top_logprobs_num=3)
            assert got["output_ids"] == ref and got["meta_info"]["prompt_tokens"] == n_prompt
            for lp, tok, _ in got["meta_info"]["output_top_logprobs"][0]:
                assert abs(lp - float(logprobs[tok])) < 1e-4
    finally:
        eng.shutdown()


def test_eight_requests_over_one_image_run_the_encoder_once(family):
    name, path, ph, eng = family
    eng.flush_cache()
    before = eng.get_server_info()["vision"]["images_encoded"]
    img = picture(11, 50, 50)
    outs = eng.generate([f"{ph} Question {i}?" for i in range(8)], [{"max_new_tokens": 2}] * 8, image_data=[img] * 8)
    assert len(outs) == 8
    assert eng.get_server_info()["vision"]["images_encoded"] == before + 1
