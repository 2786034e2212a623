"""Backend-agnostic frontend programs with structural checks, for tests (run after sgl.set_default_backend(...)).

Each function runs one program on the default backend and asserts structure (valid JSON, a choice
among the options, regex matches, message counts, ordering), never world knowledge: the default
model is a 135M one. Token budgets stay small so they are quick on a CPU.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import re
import threading

import sglpy as sgl

_shared: dict = {}
_shared_lock = threading.Lock()


def shared_engine():
    """One in-process sgl.Engine on the default model per process, so test modules load the model once."""
    with _shared_lock:
        if "engine" not in _shared:
            import torch

            torch.set_num_threads(min(2, torch.get_num_threads()))  # at most 2; fewer where the test run says so
            _shared["engine"] = sgl.Engine()
            atexit.register(_shared["engine"].shutdown)  # stop the step loop before interpreter teardown
        return _shared["engine"]


IP_REGEX = r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)"


def program_few_shot_qa():
    @sgl.function
    def few_shot_qa(s, question):
        s += "The following are questions with answers.\n\n"
        s += "Q: What is the capital of France?\nA: Paris\n"
        s += "Q: What is the capital of Germany?\nA: Berlin\n"
        s += "Q: What is the capital of Italy?\nA: Rome\n"
        s += "Q: " + question + "\n"
        s += "A:" + sgl.gen("answer", stop="\n", temperature=0, max_tokens=12)

    state = few_shot_qa.run(question="What is the capital of the United States?")
    answer = state["answer"]
    assert isinstance(answer, str) and "\n" not in answer
    assert state.text().endswith("A:" + answer)
    states = few_shot_qa.run_batch(
        [{"question": "What is the capital of Japan?"}, {"question": "What is the capital of Spain?"},
         {"question": "What is the capital of China?"}], temperature=0.1)
    assert [s.error() for s in states] == [None, None, None]
    for s, q in zip(states, ["Japan", "Spain", "China"]):  # results in input order
        assert f"Q: What is the capital of {q}?" in s.text()
        assert "\n" not in s["answer"]


def program_mt_bench():
    @sgl.function
    def multi_turn(s, q1, q2):
        s += sgl.system("You are a helpful assistant.")
        s += sgl.user(q1)
        s += sgl.assistant(sgl.gen("answer_1", max_tokens=12))
        with s.user():
            s += q2
        with s.assistant():
            s += sgl.gen("answer_2", max_tokens=12)

    state = multi_turn.run(q1="Name a fruit.", q2="Name another one.", temperature=0.7)
    msgs = state.messages()
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant"]
    assert msgs[2]["content"] == state["answer_1"].lstrip()
    assert msgs[4]["content"] == state["answer_2"].lstrip()
    end_of_turn = state.stream_executor.chat_template.stop_str
    for s in end_of_turn:  # the end-of-turn string is a stop, so it never leaks into an answer
        assert s not in state["answer_1"] and s not in state["answer_2"]


def program_select():
    @sgl.function
    def true_or_false(s, statement):
        s += "Determine whether the statement below is True, False, or Unknown.\n\n"
        s += "Statement: The capital of France is Paris.\nAnswer: True\n\n"
        s += "Statement: " + statement + "\nAnswer:" + sgl.select("answer", ["True", "False", "Unknown"])

    for statement in ("The capital of Germany is Berlin.", "Purple is a better color than green."):
        state = true_or_false.run(statement=statement)
        assert state["answer"] in ("True", "False", "Unknown")
        meta = state.get_meta_info("answer")
        assert len(meta["normalized_prompt_logprobs"]) == 3
        assert all(len(w) >= 1 for w in meta["input_token_logprobs"])
    for method in (sgl.greedy_token_selection, sgl.unconditional_likelihood_normalized):
        state = true_or_false.run(statement="The sky is green.")
        assert state["answer"] in ("True", "False", "Unknown")

        @sgl.function
        def with_method(s):
            s += "Is water wet? Answer:" + sgl.select("a", ["Yes", "No"], choices_method=method)

        assert with_method.run()["a"] in ("Yes", "No")


def program_decode_int():
    @sgl.function
    def decode_int(s):
        s += "The number of hours in a day is " + sgl.gen_int("hours", max_tokens=6) + "\n"
        s += "The number of days in a year is " + sgl.gen_int("days", max_tokens=6) + "\n"

    state = decode_int.run(temperature=0.1)
    assert re.fullmatch(r"[-+]?\d+", state["hours"]), state["hours"]
    assert re.fullmatch(r"[-+]?\d+", state["days"]), state["days"]
    int(state["hours"]), int(state["days"])


def program_decode_json_regex():
    @sgl.function
    def decode_json(s):
        from sglpy.grammar import DTYPE_REGEX

        s += "Here is the information of London, in JSON format.\n"
        with s.var_scope("json_output"):
            s += "{\n"
            s += '  "name": ' + sgl.gen("name", regex=DTYPE_REGEX["str"], max_tokens=12) + ",\n"
            s += '  "population": ' + sgl.gen("population", regex=DTYPE_REGEX["int"], stop=[" ", "\n"], max_tokens=8) + ",\n"
            s += '  "latitude": ' + sgl.gen("latitude", regex=DTYPE_REGEX["float"], stop=[" ", "\n"], max_tokens=8) + "\n"
            s += "}"

    state = decode_json.run(temperature=0)
    obj = json.loads(state["json_output"])
    assert isinstance(obj["name"], str)
    assert isinstance(obj["population"], int)
    assert isinstance(obj["latitude"], (int, float))


QUEST_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "level": {"type": "integer"},
        "is_main": {"type": "boolean"},
    },
    "required": ["name", "level", "is_main"],
    "additionalProperties": False,
}


def program_json_schema():
    @sgl.function
    def quest(s):
        s += sgl.user("Describe a game quest as JSON with name, level and is_main.")
        s += sgl.assistant(sgl.gen("info", json_schema=QUEST_SCHEMA, max_tokens=48))

    state = quest.run(temperature=0)
    obj = json.loads(state["info"])
    assert set(obj) == {"name", "level", "is_main"}
    assert isinstance(obj["name"], str) and isinstance(obj["level"], int) and isinstance(obj["is_main"], bool)


def program_expert_answer():
    @sgl.function
    def expert_answer(s, question):
        s += "Question: " + question + "\n"
        s += "A good person to answer this question is" + sgl.gen("expert", stop=[".", "\n"], max_tokens=10) + ".\n"
        expert = s["expert"]  # read mid-program: blocks until generated
        s += "For example," + expert + " would answer that" + sgl.gen("answer", stop=[".", "\n"], max_tokens=10) + "."

    state = expert_answer.run(question="What is the capital of France?", temperature=0.1)
    text = state.text()
    assert "For example," + state["expert"] + " would answer that" in text
    assert text.index(state["expert"]) < text.index("For example,")


def program_tool_use():
    @sgl.function
    def tool_use(s, lhs, rhs):
        s += "Compute with a calculator.\n"
        s += "Question: what is 3 times 4?\nAnswer: calculate(3 * 4) = 12\n"
        s += f"Question: what is {lhs} times {rhs}?\nAnswer: calculate("
        s += sgl.gen("expression", regex=r"[0-9]{1,4} \* [0-9]{1,4}", max_tokens=12) + ") = "
        a, b = (int(x) for x in s["expression"].split("*"))
        with s.var_scope("answer"):
            s += str(a * b)  # the host computes the tool result

    state = tool_use.run(lhs=257, rhs=983, temperature=0)
    a, b = (int(x) for x in state["expression"].split("*"))
    assert int(state["answer"]) == a * b
    assert state.text().endswith(f") = {a * b}")


def program_react():
    @sgl.function
    def react(s, question):
        s += "Answer by thinking, then searching or finishing.\n"
        s += "Question: " + question + "\n"
        for i in range(1, 4):
            s += f"Thought {i}:" + sgl.gen(f"thought_{i}", stop=[".", "\n"], max_tokens=10) + ".\n"
            s += f"Action {i}: " + sgl.select(f"action_{i}", choices=["Search", "Finish"]) + "["
            if s[f"action_{i}"] == "Search":
                s += sgl.gen(f"query_{i}", stop="]", max_tokens=8) + "].\n"
                s += f"Observation {i}:" + sgl.gen(f"obs_{i}", stop=[".", "\n"], max_tokens=10) + ".\n"
            else:
                s += sgl.gen("answer", stop="]", max_tokens=8) + "].\n"
                break

    state = react.run(question="What country does the creator of Linux live in?", temperature=0.1)
    actions = [state[f"action_{i}"] for i in range(1, 4) if f"action_{i}" in state]
    assert actions and all(a in ("Search", "Finish") for a in actions)
    assert all(a == "Search" for a in actions[:-1])  # the loop stops at the first Finish
    if actions[-1] == "Finish":
        assert "answer" in state
    else:
        assert len(actions) == 3


def program_parallel_decoding():
    @sgl.function
    def tips(s, topic):
        s += f"Here are two tips for {topic}.\n"
        for i in range(1, 3):
            s += f"{i}." + sgl.gen(f"tip_{i}", max_tokens=8, stop=[".", "\n"]) + ".\n"
        forks = s.fork(2)
        for i, f in enumerate(forks):
            f += f"Now, I expand tip {i + 1} into a detailed paragraph:\n"
            f += sgl.gen("detailed_tip", 12, stop=["\n\n"])
        forks.join()
        for i in range(2):
            s += f"Tip {i + 1}:" + forks[i]["detailed_tip"] + "\n"
        s += "In summary," + sgl.gen("summary", max_tokens=8)

    state = tips.run(topic="staying healthy", temperature=0.3)
    detailed = state["detailed_tip"]  # gathered by join: one value per branch, in order
    assert isinstance(detailed, list) and len(detailed) == 2
    text = state.text()
    assert text.index("Tip 1:" + detailed[0]) < text.index("Tip 2:" + detailed[1]) < text.index("In summary,")
    assert "Now, I expand tip" not in text  # branch text stays in the branches
    assert isinstance(state["summary"], str)


def program_parallel_encoding():
    @sgl.function
    def parallel_encoding(s, question, contexts):
        s += "Read the facts.\n"
        forks = s.fork(len(contexts))
        forks += lambda i: contexts[i] + "\n"
        forks.join(mode="concate_and_append")
        s += "Question: " + question + "\nAnswer:" + sgl.gen("answer", max_tokens=8, stop="\n")

    contexts = ["Noah is the father of Julian.", "Julian likes apples.", "Apples are red."]
    state = parallel_encoding.run(question="Who is the father of Julian?", contexts=contexts, temperature=0)
    text = state.text()
    positions = [text.index(c) for c in contexts]
    assert positions == sorted(positions)  # appended in branch order
    assert text.startswith("Read the facts.\n" + "\n".join(contexts) + "\nQuestion:")
    assert isinstance(state["answer"], str)


def program_stream():
    @sgl.function
    def qa(s, question):
        s += sgl.system("You are a helpful assistant.")
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=12))

    state = qa.run(question="Say hello.", stream=True, temperature=0)
    pieces = list(state.text_iter())
    assert "".join(pieces) == state.text()
    state = qa.run(question="Say hello.", stream=True, temperature=0)
    pieces = list(state.text_iter("answer"))
    assert "".join(pieces) == state["answer"]

    async def consume():
        st = qa.run(question="Say hi.", stream=True, temperature=0)
        out = [c async for c in st.text_async_iter("answer")]
        return "".join(out), st["answer"]

    joined, answer = asyncio.run(consume())
    assert joined == answer


def program_regex():
    @sgl.function
    def regex_gen(s):
        s += "Q: What is the IP address of the Google DNS servers?\nA: "
        s += sgl.gen("answer", temperature=0, regex=IP_REGEX, max_tokens=16)

    state = regex_gen.run()
    assert re.fullmatch(IP_REGEX, state["answer"]), state["answer"]


def program_dtype_gen():
    @sgl.function
    def dtype_gen(s):
        s += "Q: What is the full name of DNS?\nA: The full name is " + sgl.gen("str_res", dtype=str, stop="\n", max_tokens=12) + "\n"
        s += "Q: Which year was DNS invented?\nA: " + sgl.gen("int_res", dtype=int, max_tokens=6) + "\n"
        s += "Q: What is the value of pi?\nA: " + sgl.gen("float_res", dtype=float, max_tokens=6) + "\n"
        s += "Q: Is the sky blue?\nA: " + sgl.gen("bool_res", dtype=bool, max_tokens=4) + "\n"

    state = dtype_gen.run(temperature=0)
    assert state["str_res"].startswith('"'), state["str_res"]
    int(state["int_res"])
    float(state["float_res"])
    assert state["bool_res"] in ("True", "False")


def program_gen_min_new_tokens(min_tokens: int = 8):
    @sgl.function
    def min_tokens_prog(s):
        s += sgl.user("Say OK.")
        s += sgl.assistant(sgl.gen("answer", min_tokens=min_tokens, max_tokens=min_tokens + 4))

    state = min_tokens_prog.run(temperature=0)
    assert state.get_meta_info("answer")["completion_tokens"] >= min_tokens


def program_run_batch_progress_bar():
    @sgl.function
    def color(s, thing):
        s += f"The color of {thing} is" + sgl.gen("color", max_tokens=4, stop=["\n", "."])

    things = ["grass", "the sky", "snow", "coal"]
    states = color.run_batch([{"thing": t} for t in things], progress_bar=True, temperature=0, num_threads=2)
    assert [s.error() for s in states] == [None] * 4
    assert [s.text().split(" is")[0] for s in states] == [f"The color of {t}" for t in things]


def program_run_async():
    @sgl.function
    def hello(s, name):
        s += f"Hello {name}," + sgl.gen("rest", max_tokens=4)

    async def main():
        return await asyncio.gather(*(hello.run_async(name=n, temperature=0) for n in ("Ann", "Bob")))

    a, b = asyncio.run(main())
    assert a.text().startswith("Hello Ann,") and b.text().startswith("Hello Bob,")


# The registry: name -> program. Each program runs on the default backend and raises AssertionError on a
# structural failure; callers (tests/frontend, or SGLang's own frontend package) pick the backend.
PROGRAMS = {p.__name__.removeprefix("program_"): p for p in (
    program_few_shot_qa, program_mt_bench, program_select, program_decode_int, program_decode_json_regex,
    program_json_schema, program_expert_answer, program_tool_use, program_react, program_parallel_decoding,
    program_parallel_encoding, program_stream, program_regex, program_dtype_gen, program_gen_min_new_tokens,
    program_run_batch_progress_bar, program_run_async)}
