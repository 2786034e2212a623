"""Role strings derived from jinja chat templates, and equality with the tokenizer's own rendering."""

import pytest

import sglpy as sgl
from sglpy.backend_fake import FakeBackend
from sglpy.chat_template import from_hf_tokenizer, from_jinja, get_chat_template_by_model_path

LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
NO_SYSTEM = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{{ '<turn>' + m['role'] + '\n' + m['content'] + '<end>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<turn>assistant\n' }}{% endif %}"
)


def test_llama3_like_template_with_bos():
    kept = from_jinja(LLAMA3, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    assert kept.get_prefix_and_suffix("system")[0] == "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
    assert kept.get_prefix_and_suffix("user") == ("<|start_header_id|>user<|end_header_id|>\n\n", "<|eot_id|>")
    assert kept.stop_str == ("<|eot_id|>",) and kept.default_system_prompt is None
    stripped = from_jinja(LLAMA3, bos_token="<|begin_of_text|>", add_bos=True)
    assert stripped.get_prefix_and_suffix("system")[0] == "<|start_header_id|>system<|end_header_id|>\n\n"


def test_template_without_a_system_role():
    tpl = from_jinja(NO_SYSTEM)
    assert tpl.get_prefix_and_suffix("user") == ("<turn>user\n", "<end>\n")
    assert tpl.get_prefix_and_suffix("assistant") == ("<turn>assistant\n", "<end>\n")
    assert tpl.stop_str == ("<end>",)

    @sgl.function
    def prog(s):
        s += sgl.system("nope")

    with pytest.warns(RuntimeWarning, match="no 'system' role"):
        st = prog.run(backend=FakeBackend(chat_template=tpl))
        st.sync()
    assert isinstance(st.error(), ValueError) and "no 'system' role" in str(st.error())


def test_name_matching_fallback():
    assert get_chat_template_by_model_path("HuggingFaceTB/SmolLM2-135M-Instruct").name == "chatml"
    assert get_chat_template_by_model_path("meta-llama/Meta-Llama-3-8B-Instruct").name == "llama-3-instruct"
    assert get_chat_template_by_model_path("gpt2").name == "default"


@pytest.mark.slow
def test_role_blocks_render_exactly_like_apply_chat_template():
    from sglpy.testing_programs import shared_engine

    tok = shared_engine().tokenizer  # the engine's own tokenizer (model loaded once per test process)
    tpl = from_hf_tokenizer(tok)
    fb = FakeBackend(chat_template=tpl, default_response="Fine, thanks.")

    @sgl.function
    def chat(s, with_system):
        if with_system:
            s += sgl.system("Be brief.")
        s += sgl.user("How are you?")
        s += sgl.assistant(sgl.gen("a"))
        s += sgl.user("Good.")
        s += sgl.assistant_begin()

    for with_system in (True, False):
        st = chat.run(with_system=with_system, backend=fb)
        msgs = st.messages()
        expected = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        assert st.text() == expected
    assert tpl.stop_str == ("<|im_end|>",)
