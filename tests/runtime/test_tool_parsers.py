"""Tool-call formats: constraint, rendering and the (streaming) parser agree with each other, for every format."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglpy.grammar import GrammarCompiler
from sglpy.grammar.testing import small_vocab_info
from sglpy.runtime.tools import (CallArgs, CallBegin, Content, ToolCall, ToolCallStream, ToolChoice, ToolError,
                                 ToolSetup, get_format, parse_tool_calls, parse_tool_choice, parse_tools,
                                 render_conversation, tool_constraint)
from sglpy.runtime.tools.registry import FORMATS, detect

TOOLS = parse_tools([
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
    {"name": "echo", "description": "bare function object", "parameters": {
        "type": "object", "properties": {"s": {"type": "string", "maxLength": 5}}, "required": ["s"]}},
])
ARGS = st.fixed_dictionaries({"a": st.integers(-10**6, 10**6), "b": st.integers(-99, 99)})
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20)


@pytest.fixture(scope="module")
def compiler():
    return GrammarCompiler(small_vocab_info())


def accepts(guide, text: str) -> bool:
    try:
        return guide.is_final(guide.advance_bytes(guide.initial_state, text.encode()))
    except ValueError:
        return False


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_constraint_accepts_exactly_the_calls_the_parser_reads(compiler, name):
    fmt = get_format(name)
    call = fmt.render_call("add", '{"a": 1, "b": 2}')
    req = compiler.compile("structural_tag", tool_constraint(fmt, TOOLS, ToolChoice("required"), True))
    assert accepts(req, call)
    assert accepts(req, call + fmt.joiner + fmt.render_call("echo", '{"s": "hi"}'))
    assert not accepts(req, fmt.render_call("add", '{"a": 1}'))  # b is required
    assert not accepts(req, fmt.render_call("nope", "{}"))
    for parallel in (False, True):  # a named choice is one call, whatever parallel_tool_calls says
        named = compiler.compile("structural_tag", tool_constraint(fmt, TOOLS, ToolChoice("named", "echo"), parallel))
        echo = fmt.render_call("echo", '{"s": "hi"}')
        assert accepts(named, echo) and not accepts(named, call)
        assert not named.can_continue(named.advance_bytes(named.initial_state, echo.encode()))  # the output ends
        assert not accepts(named, echo + fmt.joiner + echo)
    one = compiler.compile("structural_tag", tool_constraint(fmt, TOOLS, ToolChoice("required"), False))
    assert accepts(one, call) and not accepts(one, call + fmt.joiner + call)
    auto = compiler.compile("structural_tag", tool_constraint(fmt, TOOLS, ToolChoice("auto"), True))
    assert accepts(auto, "Let me add. " + call) and accepts(auto, "no call at all")
    assert not accepts(auto, "Let me add. " + fmt.trigger + " oops")
    parsed = parse_tool_calls("Let me add. " + call + fmt.joiner + fmt.render_call("echo", '{"s": "hi"}'), fmt)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("add", '{"a": 1, "b": 2}'), ("echo", '{"s": "hi"}')]
    assert parsed.content.strip() == "Let me add." and not parsed.incomplete
    assert tool_constraint(fmt, TOOLS, ToolChoice("none"), True) is None


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(FORMATS)), before=TEXT, calls=st.lists(ARGS, min_size=1, max_size=3),
       cuts=st.lists(st.integers(0, 400), max_size=8))
def test_streaming_in_any_pieces_equals_parsing_the_whole(name, before, calls, cuts):
    fmt = get_format(name)
    before = before.replace(fmt.trigger, "")
    text = before + fmt.joiner.join(fmt.render_call("add", json.dumps(a)) for a in calls)
    whole = parse_tool_calls(text, fmt)
    assert [json.loads(c.arguments) for c in whole.calls] == calls
    p, events, last = ToolCallStream(fmt), [], 0
    for cut in sorted(set(c for c in cuts if c < len(text))) + [len(text)]:
        events += p.feed(text[last:cut])
        last = cut
    events += p.finish()
    content = "".join(e.text for e in events if isinstance(e, Content))
    begins = [e for e in events if isinstance(e, CallBegin)]
    args = {}
    for e in events:
        if isinstance(e, CallArgs):
            args[e.index] = args.get(e.index, "") + e.text
    assert content == whole.content
    assert [b.name for b in begins] == ["add"] * len(calls)
    assert [json.loads(args[b.index]) for b in begins] == calls


def test_cut_short_calls_are_incomplete_and_lookalikes_stay_content():
    fmt = get_format("hermes")
    cut = parse_tool_calls('ok <tool_call>\n{"name": "add", "arguments": {"a": 1', fmt)
    assert cut.incomplete and not cut.calls
    look = parse_tool_calls("see <tool_call> tags <tool_c", fmt)
    assert look.content == "see <tool_call> tags <tool_c" and not look.calls


def test_detection_and_parser_names():
    assert detect(None) == ToolSetup(get_format("generic"), False)
    assert detect("{{ messages }}") == ToolSetup(get_format("generic"), False)
    assert detect("{% if tools %}<tool_call>{% endif %}").format.name == "hermes"
    assert detect("{% if tools %}[TOOL_CALLS]{% endif %}").format.name == "mistral"
    assert detect("{% if tools %}<|python_tag|>{% endif %}").format.name == "llama3"
    assert detect(None, "qwen25") == ToolSetup(get_format("hermes"), False)
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        get_format("gpt-oss")


def test_generic_rendering_and_history():
    setup = detect(None)
    call = ToolCall("add", '{"a": 1, "b": 2}', "call_9")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+2?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": "3", "tool_call_id": "call_9"}]
    out, extra = render_conversation(msgs, setup, TOOLS)
    assert extra == {}
    assert out[0]["content"].startswith("Be brief.\n\n") and '"name": "echo"' in out[0]["content"]
    assert out[2] == {"role": "assistant", "content": '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}'
                                                       "\n</tool_call>"}
    assert out[3] == {"role": "user", "content": "<tool_response>\n3\n</tool_response>"}
    bad = msgs[:2] + [{"role": "tool", "content": "3", "tool_call_id": "call_0"}]
    with pytest.raises(ToolError) as e:
        render_conversation(bad, setup, TOOLS)
    assert e.value.param == "messages[2].tool_call_id"


@pytest.mark.parametrize("raw,choice,param", [
    ([{"type": "function", "function": {"name": "f", "parameters": []}}], None, "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f", "extra": 1}}], None, "tools[0].function"),
    ([{"name": "f"}, {"name": "f"}], None, "tools[1].name"),
    ([{"name": "f"}], "sometimes", "tool_choice"),
    ([{"name": "f"}], {"type": "function", "function": {"name": "g"}}, "tool_choice"),
])
def test_bad_tools_name_the_field(raw, choice, param):
    with pytest.raises(ToolError) as e:
        parse_tool_choice(choice, parse_tools(raw))
    assert e.value.param == param
