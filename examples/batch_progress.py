"""A batch with a progress bar: run_batch runs items concurrently (continuous batching in the runtime)."""

import sglpy as sgl
from example_backend import default_backend

FEW_SHOT = (
    "Answer with one word.\n"
    "Q: What color is grass?\nA: green\n"
    "Q: What color is snow?\nA: white\n"
)


@sgl.function
def color(s, thing):
    s += FEW_SHOT  # a constant prefix: run_batch traces it and caches it once for every item
    s += f"Q: What color is {thing}?\nA:" + sgl.gen("answer", max_tokens=4, stop="\n")


def main(backend=None, n: int = 8):
    """Answer n questions with a tqdm bar; returns the answers in input order."""
    backend = backend or default_backend()
    things = ["the sky", "coal", "a banana", "blood", "an orange", "milk", "a leaf", "the sun"][:n]
    states = color.run_batch([{"thing": t} for t in things], progress_bar=True, temperature=0, backend=backend)
    answers = [st["answer"].strip() for st in states]
    for t, a in zip(things, answers):
        print(f"{t}: {a}")
    return answers


if __name__ == "__main__":
    main()
