"""Parallel decoding with fork: branches share the prefix's KV (one prefill), then expand in parallel."""

import sglpy as sgl
from example_backend import default_backend

TIPS = ["Eat a balanced diet.", "Exercise regularly."]


@sgl.function
def tips(s, topic):
    s += sgl.system("You give short, practical advice.")
    forks = s.fork(len(TIPS))  # the shared prefix is cached once; every branch reuses it
    for i, f in enumerate(forks):
        f += sgl.user(f"Explain in one sentence why this tip helps with {topic}: {TIPS[i]}")
        f += sgl.assistant(sgl.gen("detail", max_tokens=40, stop="\n"))
    forks.join()  # "detail" becomes a list, one entry per branch
    summary = "\n".join(f"Tip {i + 1}: {d.strip()}" for i, d in enumerate(s["detail"]))
    s += sgl.user(summary + "\nWhich tip matters more, 1 or 2?")
    s += sgl.assistant("Tip " + sgl.select("best", choices=["1", "2"]))


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
