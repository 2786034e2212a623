"""Every example in examples/ runs against the default model (in-process engine); structure is checked."""

import json
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def backend():
    from sglpy.testing_programs import shared_engine

    sys.path.insert(0, str(EXAMPLES))
    yield shared_engine()
    sys.path.remove(str(EXAMPLES))


def constrained(backend) -> bool:
    return getattr(backend.engine, "constrained", None) is not None


def test_quest_json_regex(backend):
    import quest_json_regex

    state = quest_json_regex.generate_quest(backend)
    text = state["json_output"]
    assert re.fullmatch(quest_json_regex.QUEST_REGEX, text)
    quest = json.loads(text)
    assert quest["difficulty"] in ("Easy", "Medium", "Hard", "Extreme")
    assert isinstance(quest["level_requirement"], int)
    quest_json_regex.main(backend)


def test_tool_use_select(backend):
    import tool_use_select

    for tool, inp, result in tool_use_select.main(backend):
        assert tool in tool_use_select.TOOLS
        if constrained(backend):
            assert result == tool_use_select.TOOLS[tool](inp.strip())


def test_tool_loop(backend):
    import tool_loop

    call, result, answer = tool_loop.program_loop(backend)
    assert call.name in tool_loop.IMPLS and isinstance(answer, str)
    if constrained(backend):
        assert result == tool_loop.IMPLS[call.name](**call.arguments)


def test_parallel_tips_fork(backend):
    import parallel_tips_fork

    state = parallel_tips_fork.main(backend)
    assert len(state["detail"]) == 2 and state["best"] in ("1", "2")


def test_json_schema_extraction(backend):
    import json_schema_extraction

    people = json_schema_extraction.main(backend)
    assert len(people) == 2
    if constrained(backend):
        import jsonschema

        for p in people:
            jsonschema.validate(p, json_schema_extraction.PERSON_SCHEMA)


def test_batch_progress(backend, capsys):
    import batch_progress

    answers = batch_progress.main(backend, n=4)
    assert len(answers) == 4 and all("\n" not in a for a in answers)
    assert "color" in capsys.readouterr().err  # the tqdm bar


def test_streaming(backend):
    import streaming

    whole, var, async_text = streaming.main(backend)
    assert whole.startswith("<|im_start|>system\nYou are a concise storyteller.")
    assert var and async_text


def test_demo_programs_main_runs(backend, capsys):
    import demo_programs

    demo_programs.main(backend)
    out = capsys.readouterr().out
    for title in ("Quest JSON", "Tool use", "Parallel tips", "Batch"):
        assert f"=== {title}" in out


def test_an_example_runs_as_a_script():
    out = subprocess.run([sys.executable, str(EXAMPLES / "batch_progress.py")], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "the sky:" in out.stdout


def test_lora_adapters():
    sys.path.insert(0, str(EXAMPLES))
    try:
        import lora_adapters

        texts, line = lora_adapters.main()
    finally:
        sys.path.remove(str(EXAMPLES))
    assert len(set(texts.values())) == 3 and isinstance(line, str)  # each adapter changes the base's answer
