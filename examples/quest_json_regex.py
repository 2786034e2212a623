"""Quest generation with a JSON regex: the output is forced into the exact JSON layout below."""

import json

import sglpy as sgl
from example_backend import default_backend

QUEST_REGEX = (
    r"""\{\n"""
    + r"""    "quest_name": "[\w\d\s]{1,32}",\n"""
    + r"""    "difficulty": "(Easy|Medium|Hard|Extreme)",\n"""
    + r"""    "level_requirement": [0-9]{1,2},\n"""
    + r"""    "is_timed": "(True|False)",\n"""
    + r"""    "reward": "[\w\d\s]{1,32}",\n"""
    + r"""    "objective": "[\w\d\s]{1,64}"\n"""
    + r"""\}"""
)


@sgl.function
def quest_gen(s, quest_name):
    s += quest_name + " is a quest in a text-based game. Please fill in the following information about this quest.\n"
    s += sgl.gen("json_output", max_tokens=128, regex=QUEST_REGEX)


def generate_quest(backend, quest_name: str = "The Lost Crown"):
    """Run the program; returns its state (reading json_output raises sgl.ProgramError on failure)."""
    return quest_gen.run(quest_name=quest_name, temperature=0, backend=backend)


def main(backend=None):
    """Generate one quest and return the parsed JSON (None if generation failed or was not constrained)."""
    backend = backend or default_backend()
    state = generate_quest(backend)
    try:
        print(state["json_output"])
    except sgl.ProgramError as e:
        print(f"quest generation failed: {e}")
        return None
    try:
        quest = json.loads(state["json_output"])
    except ValueError:
        print("(not valid JSON: this runtime does not enforce regex constraints yet)")
        return None
    print("difficulty:", quest["difficulty"], "| level:", quest["level_requirement"])
    return quest


if __name__ == "__main__":
    main()
