"""Parallel decoding with fork: branches share the prefix's KV (one prefill), then expand in parallel."""

import sglpy as sgl
from example_backend import default_backend


@sgl.function
def tips(s, topic):
    s += f"Here are two short tips for {topic}.\n"
    s += "1. Eat a balanced diet.\n2. Exercise regularly.\n"
    forks = s.fork(2)  # the shared prefix is cached once; both branches reuse it
    for i, f in enumerate(forks):
        f += f"Now, expand tip {i + 1} into one detailed sentence:\n"
        f += sgl.gen("detail", max_tokens=32, stop=["\n\n"])
    forks.join()
    s += "Tip 1: " + forks[0]["detail"].strip() + "\nTip 2: " + forks[1]["detail"].strip() + "\n"
    s += "The better tip is number " + sgl.select("best", choices=["1", "2"])


def main(backend=None):
    """Expand two tips in parallel and pick the better one; returns the state."""
    backend = backend or default_backend()
    state = tips.run(topic="staying healthy", temperature=0.3, backend=backend)
    for i, d in enumerate(state["detail"]):
        print(f"tip {i + 1}: {d.strip()}")
    print("best:", state["best"])
    return state


if __name__ == "__main__":
    main()
