"""Tool use: the model picks a tool with `select`, writes its input, and host code runs the tool."""

import operator
import re

import sglpy as sgl
from example_backend import default_backend

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def calculator(expr: str) -> str:
    """Evaluate `a op b` (never eval() model output)."""
    m = re.fullmatch(r"\s*(\d+)\s*([-+*])\s*(\d+)\s*", expr)
    if m is None:
        raise ValueError(f"not an arithmetic expression: {expr!r}")
    return str(_OPS[m.group(2)](int(m.group(1)), int(m.group(3))))


TOOLS = {"calculator": calculator, "reverse": lambda text: text[::-1]}


FEW_SHOT = (
    "Pick the tool for each question: calculator for arithmetic, reverse for reversing a word.\n\n"
    "Question: reverse the word stop\nTool: reverse\nInput: stop\nResult: pots\n\n"
    "Question: what is 12 * 3?\nTool: calculator\nInput: 12 * 3\nResult: 36\n\n"
    "Question: reverse the word cat\nTool: reverse\nInput: cat\nResult: tac\n\n"
    "Question: what is 7 + 5?\nTool: calculator\nInput: 7 + 5\nResult: 12\n\n"
)


@sgl.function
def tool_use(s, question):
    s += FEW_SHOT + "Question: " + question + "\nTool: " + sgl.select("tool", choices=list(TOOLS)) + "\n"
    # "Input:" without a trailing space: the space belongs to the first generated token (" 257", " drawer").
    if s["tool"] == "calculator":
        s += "Input:" + sgl.gen("input", regex=r" [0-9]{1,4} [-+*] [0-9]{1,4}", max_tokens=12) + "\n"
    else:
        s += "Input:" + sgl.gen("input", regex=r" [a-z]{1,12}", max_tokens=8) + "\n"
    try:
        result = TOOLS[s["tool"]](s["input"].strip())
    except ValueError as e:  # only reachable if the runtime does not enforce the regex
        result = f"error: {e}"
    s += "Result: " + result + "\n"
    s["result"] = result


def main(backend=None):
    """Answer two questions with tools; return [(tool, input, result)]."""
    backend = backend or default_backend()
    out = []
    for q in ("what is 257 * 983?", "reverse the word drawer"):
        state = tool_use.run(question=q, temperature=0, backend=backend)
        out.append((state["tool"], state["input"], state["result"]))
        print(f"{q!r}: tool={state['tool']} input={state['input']!r} result={state['result']}")
    return out


if __name__ == "__main__":
    main()
