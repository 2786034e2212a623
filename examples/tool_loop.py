"""A tool-use loop: the model calls a tool (always a valid call), the program runs it, sends the result back
as a tool message, and the model answers. Two ways: an sglpy program (`sgl.gen(..., tools=...)`), and the
OpenAI chat API of `sglpy serve` (`tools` + `role: "tool"` messages; plain `requests`, any OpenAI client works).

    python examples/tool_loop.py                 # the program, in-process on the default model
    python examples/tool_loop.py --url URL       # the program over HTTP, then the OpenAI-API loop on URL
"""

import json
import sys

import sglpy as sgl
from example_backend import default_backend

WEATHER = {"Paris": (18, "cloudy"), "Oslo": (4, "snow"), "Lisbon": (24, "sunny")}


def get_weather(city: str, unit: str = "c") -> str:
    """The tool's implementation (a table here; a real program would call a service)."""
    temp, sky = WEATHER.get(city.strip().title(), (15, "unknown"))
    return json.dumps({"city": city, "temperature": temp if unit == "c" else round(temp * 9 / 5 + 32),
                       "unit": unit, "sky": sky})


def add(a: int, b: int) -> str:
    return str(a + b)


IMPLS = {"get_weather": get_weather, "add": add}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "minimum": -10**6, "maximum": 10**6},
            "b": {"type": "integer", "minimum": -10**6, "maximum": 10**6}},
            "required": ["a", "b"], "additionalProperties": False}}},
]


@sgl.function
def ask_with_tools(s, question):
    s += sgl.system("You are a helpful assistant.\n" + sgl.tool_prompt(TOOLS))
    s += sgl.user(question)
    # required: the first turn is a call; its arguments always match the tool's schema
    s += sgl.assistant(sgl.gen("call", tools=TOOLS, tool_choice="required", max_tokens=80, temperature=0))
    call = s["call"].call
    result = IMPLS[call.name](**call.arguments)
    s["result"] = result
    s += sgl.user(f"<tool_response>\n{result}\n</tool_response>")
    s += sgl.assistant_begin() + "The " + call.name.replace("_", " ") + " tool says"
    s += sgl.gen("answer", max_tokens=48, temperature=0) + sgl.assistant_end()


def program_loop(backend, question="What is the weather in Paris right now?"):
    """The sglpy program: returns (call, tool result, answer)."""
    state = ask_with_tools.run(question, backend=backend)
    call = state["call"].call
    print(f"[program] call: {call.name}({json.dumps(call.arguments)}) -> {state['result']}")
    print(f"[program] answer: {state['answer'].strip()[:200]}")
    return call, state["result"], state["answer"]


def openai_loop(url, question="What is 1234 plus 4321?"):
    """The OpenAI chat API: call (tool_choice required), run the tool, send a tool message, get the answer."""
    import requests

    messages = [{"role": "user", "content": question}]
    body = {"model": "default", "messages": messages, "tools": TOOLS, "tool_choice": "required", "temperature": 0,
            "max_tokens": 80, "parallel_tool_calls": False}
    first = requests.post(url + "/v1/chat/completions", json=body, timeout=300).json()
    msg = first["choices"][0]["message"]
    call = msg["tool_calls"][0]
    result = IMPLS[call["function"]["name"]](**json.loads(call["function"]["arguments"]))
    print(f"[openai] finish_reason={first['choices'][0]['finish_reason']} call: {call['function']['name']}"
          f"({call['function']['arguments']}) -> {result}")
    messages += [msg, {"role": "tool", "tool_call_id": call["id"], "content": result}]
    body = {**body, "messages": messages, "tool_choice": "none", "max_tokens": 48}
    second = requests.post(url + "/v1/chat/completions", json=body, timeout=300).json()
    answer = second["choices"][0]["message"]["content"]
    print(f"[openai] answer: {answer.strip()[:200]}")
    return call, result, answer


def main(backend=None):
    backend = backend or default_backend()
    out = program_loop(backend)
    url = getattr(backend, "base_url", None)
    if url:
        openai_loop(url)
    return out


if __name__ == "__main__":
    main()
    sys.exit(0)
