"""One program on hosted-API backends: sgl.OpenAI (chat and completion models) and sgl.Anthropic, against
`sglpy serve` (or any server speaking those APIs), with speculative execution filling a 3-field assistant turn
from one API call.

    python examples/hosted_backends.py                          # starts `sglpy serve` on the default model
    python examples/hosted_backends.py --url http://127.0.0.1:30000
"""

import sys

import sglpy as sgl

COLORS = ["red", "green", "blue"]


@sgl.function
def describe(s, thing):
    s += sgl.system("You answer briefly.")
    s += sgl.user(f"In a few words, what is {thing}?")
    s += sgl.assistant(sgl.gen("answer", max_tokens=24, stop="\n"))
    s += sgl.user(f"Which color is {thing} most often?")
    s += sgl.assistant(sgl.select("color", COLORS))  # a constrained choice on our server


@sgl.function(num_api_spec_tokens=48)
def profile(s, who):
    s += sgl.user(f"Write a profile of {who} as Name, Job and City lines.")
    s += sgl.assistant("Name:" + sgl.gen("name", stop="\n") + "\nJob:" + sgl.gen("job", stop="\n")
                       + "\nCity:" + sgl.gen("city", stop="\n"))  # one API call when the model keeps the format


@sgl.function
def pick(s, question):
    s += question + "\nAnswer:" + sgl.select("answer", [" yes", " no"])  # completion model: scored by logprobs


def main(url: str):
    """Run the programs on each backend against `url` (a server root); returns what they produced."""
    chat = sgl.OpenAI("default", base_url=url + "/v1")
    completion = sgl.OpenAI("default", base_url=url + "/v1", is_chat_model=False)
    claude_api = sgl.Anthropic("default", base_url=url)
    out = {}
    for name, backend in (("openai-chat", chat), ("anthropic", claude_api)):
        state = describe.run(thing="grass", backend=backend, temperature=0)
        out[name] = (state["answer"], state["color"], state.get_meta_info("color")["select_method"])
        print(f"{name}: {state['answer']!r}; color {state['color']} ({out[name][2]})")
    state = profile.run(who="a baker from Lyon", backend=chat, temperature=0)
    out["profile"] = ([state["name"], state["job"], state["city"]], chat.token_usage.calls)
    print(f"profile: {out['profile'][0]} ({state.get_meta_info('city').get('api_spec')}; "
          f"{chat.token_usage.calls} calls so far on the chat backend)")
    state = pick.run(question="Is the sky blue?", backend=completion)
    out["pick"] = (state["answer"], state.get_meta_info("answer")["normalized_prompt_logprobs"])
    print(f"completion select: {state['answer']!r}, mean logprobs {out['pick'][1]}")
    return out


if __name__ == "__main__":
    if "--url" in sys.argv:
        main(sys.argv[sys.argv.index("--url") + 1].rstrip("/"))
    else:
        with sgl.Runtime() as runtime:
            main(runtime.url)
