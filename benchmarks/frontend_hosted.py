"""API speculative execution on a 3-field program: API calls and latency with and without num_api_spec_tokens.

The program fills three fields (name, job, city), each a gen with stop "\\n", after a few-shot example so the
model follows the format. It runs on sgl.OpenAI against an OpenAI-compatible server, as a completion model
(/v1/completions) and as a chat model (/v1/chat/completions, the three gens inside one assistant turn),
alternating spec / no-spec runs so both see the same machine state, and reports per-run calls and the median
and spread of wall time. Without speculation the chat program needs a server that continues a partial
assistant message (ours: continue_final_message), as each gen after the first continues the turn.

    python benchmarks/frontend_hosted.py                 # starts `sglpy serve` on the default model
    python benchmarks/frontend_hosted.py --url http://127.0.0.1:30000 --reps 10
    python benchmarks/frontend_hosted.py --stub-latency 0.15   # a scripted endpoint with a fixed round trip
"""

from __future__ import annotations

import argparse
import statistics
import time

import sglpy as sgl

EXAMPLE = "Name: Alice Smith\nJob: teacher\nCity: Boston\n"
PEOPLE = ["a baker from France", "a pilot from Canada", "a doctor from Japan", "a farmer from Kenya",
          "a poet from Chile", "a chef from Italy"]


def programs(spec):
    @sgl.function(num_api_spec_tokens=spec)
    def completion(s, who):
        s += "Fill in the profile of each person.\n\nPerson: a teacher from the USA\n" + EXAMPLE + "\n"
        s += f"Person: {who}\n"
        s += "Name:" + sgl.gen("name", stop="\n", max_tokens=12) + "\n"
        s += "Job:" + sgl.gen("job", stop="\n", max_tokens=8) + "\n"
        s += "City:" + sgl.gen("city", stop="\n", max_tokens=8) + "\n"

    @sgl.function(num_api_spec_tokens=spec)
    def chat(s, who):
        s += sgl.system("Answer in exactly the format of the example.")
        s += sgl.user("Profile of a teacher from the USA.")
        s += sgl.assistant(EXAMPLE.rstrip("\n"))
        s += sgl.user(f"Profile of {who}.")
        s += sgl.assistant("Name:" + sgl.gen("name", stop="\n", max_tokens=12) + "\nJob:"
                           + sgl.gen("job", stop="\n", max_tokens=8) + "\nCity:" + sgl.gen("city", stop="\n",
                                                                                              max_tokens=8))

    return completion, chat


def measure(backend, program, who) -> tuple[float, int, str]:
    """(seconds, API calls, api_spec outcome of the first field) for one run."""
    backend.token_usage.reset()
    t0 = time.perf_counter()
    state = program.run(who=who, backend=backend, temperature=0)
    state.sync()
    fields = [state["name"], state["job"], state["city"]]
    assert all(isinstance(f, str) for f in fields)
    meta = state.get_meta_info("city") or {}
    return time.perf_counter() - t0, backend.token_usage.calls, str(meta.get("api_spec", "-"))


def run(url: str, reps: int, spec_tokens: int, modes: list[str], extensions=None) -> None:
    for mode in modes:
        backend = sgl.OpenAI("default", base_url=url, is_chat_model=(mode == "chat"), max_retries=0,
                             sglang_extensions=extensions)
        results = {"spec": [], "plain": []}
        for rep in range(reps):
            who = PEOPLE[rep % len(PEOPLE)]
            for kind in (("spec", "plain") if rep % 2 == 0 else ("plain", "spec")):  # interleaved
                progs = programs(spec_tokens if kind == "spec" else None)
                results[kind].append(measure(backend, progs[0 if mode == "completion" else 1], who))
        for kind, rows in results.items():
            secs = [r[0] for r in rows]
            calls = [r[1] for r in rows]
            outcomes = {o: sum(1 for r in rows if r[2] == o) for o in sorted({r[2] for r in rows})}
            print(f"{mode:10s} {kind:5s}: median {statistics.median(secs) * 1000:7.1f} ms (min {min(secs) * 1000:.1f}, "
                  f"max {max(secs) * 1000:.1f}), calls per run {sorted(set(calls))} mean {statistics.mean(calls):.2f}, "
                  f"last field's api_spec {outcomes}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server's /v1 base URL (default: start `sglpy serve`)")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--spec-tokens", type=int, default=48)
    ap.add_argument("--modes", default="completion,chat")
    ap.add_argument("--stub-latency", type=float, help="use the scripted endpoint with this round trip (seconds)")
    args = ap.parse_args()
    modes = args.modes.split(",")
    if args.stub_latency is not None:
        from sglpy.runtime.testing.stub_openai import StubOpenAI

        def follow_format(body):  # a model that always follows the format
            answer = "Name: Bob Stone\nJob: baker\nCity: Lyon\n"
            if "prompt" in body:  # the text after the person's line is the part of the answer written so far
                written = body["prompt"].split("Person: ")[-1].split("\n", 1)[-1]
                return answer[len(written):]
            last = body["messages"][-1]
            return answer[len(last["content"]):] if last["role"] == "assistant" else answer

        with StubOpenAI(follow_format, latency=args.stub_latency) as stub:
            # it continues partial assistant messages as our server does (continue_final_message)
            run(stub.url, args.reps, args.spec_tokens, modes, extensions=True)
        return
    if args.url:
        run(args.url, args.reps, args.spec_tokens, modes)
        return
    runtime = sgl.Runtime()
    try:
        run(runtime.url + "/v1", args.reps, args.spec_tokens, modes)
    finally:
        runtime.shutdown()


if __name__ == "__main__":
    main()
