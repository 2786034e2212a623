"""Streaming: print the whole text as it is generated, then just one variable, then via asyncio."""

import asyncio

import sglpy as sgl
from example_backend import default_backend


@sgl.function
def story(s, topic):
    s += sgl.system("You are a concise storyteller.")
    s += sgl.user(f"Tell a two-sentence story about {topic}.")
    s += sgl.assistant(sgl.gen("story", max_tokens=32))


def main(backend=None):
    """Stream three times; returns the three streamed texts."""
    backend = backend or default_backend()
    state = story.run(topic="a lighthouse", stream=True, temperature=0, backend=backend)
    whole = ""
    for chunk in state.text_iter():  # everything, role markup included
        whole += chunk
        print(chunk, end="", flush=True)
    print()
    state = story.run(topic="a fox", stream=True, temperature=0, backend=backend)
    var = ""
    for chunk in state.text_iter("story"):  # only the generated variable
        var += chunk
        print(chunk, end="", flush=True)
    print()

    async def consume():
        st = story.run(topic="a kite", stream=True, temperature=0, backend=backend)
        return "".join([c async for c in st.text_async_iter("story")])

    async_text = asyncio.run(consume())
    print(async_text)
    return whole, var, async_text


if __name__ == "__main__":
    main()
