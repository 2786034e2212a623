"""state.trace(): the executed tree of a program (gens with token origins, selects with scores, roles, forks,
joins, timing) and its self-contained HTML page."""

import json

import sglpy as sgl
from sglpy.backend_fake import FakeBackend
from sglpy.program_trace import tokens_by_origin


@sgl.function
def plan(s, topic):
    s += sgl.system("You plan.")
    s += sgl.user("Topic: " + topic)
    s += sgl.assistant(sgl.gen("idea", max_tokens=16))
    forks = s.fork(2)
    forks += lambda i: f"Branch {i}: " + sgl.gen("step", max_tokens=8)
    forks.join()
    s += "Pick: " + sgl.select("pick", choices=["first", "second"])


def test_trace_tree_of_a_program():
    fb = FakeBackend(responses=["an idea", "step one", "step two"], choice_picker=lambda p, c: 1)
    state = plan.run(topic="<b>tea</b>", backend=fb)
    trace = state.trace()
    kinds = [n.kind for n in trace.nodes]
    assert kinds[:3] == ["role_begin", "text", "role_end"] and "fork" in kinds and "join" in kinds
    gen = next(n for n in trace.nodes if n.kind == "gen")
    assert gen.name == "idea" and gen.role == "assistant" and gen.text == "an idea"
    meta = state.get_meta_info("idea")
    assert gen.detail["tokens"] == {"cached": meta["cached_tokens"], "prefilled": meta["prompt_tokens"] - meta["cached_tokens"],
                                    "sampled": len("an idea"), "jump_forward": 0}
    fork = next(n for n in trace.nodes if n.kind == "fork")
    assert fork.detail == {"size": 2} and len(fork.branches) == 2
    branch_gens = [[n for n in b.nodes if n.kind == "gen"][0] for b in fork.branches]
    assert sorted(g.text for g in branch_gens) == ["step one", "step two"]
    sel = next(n for n in trace.nodes if n.kind == "select")
    assert sel.text == "second" and sel.detail["choices"] == ["first", "second"]
    assert sel.detail["scores"][1] > sel.detail["scores"][0]
    assert [n.name for n in trace.gens()] == ["idea", "step", "step", "pick"]
    starts = [n.start for n in trace.nodes]
    assert starts == sorted(starts) and all(n.end >= n.start for n in trace.nodes)
    assert json.loads(json.dumps(trace.to_json()))["nodes"][0]["kind"] == "role_begin"
    assert "branch 1:" in str(trace)


def test_to_html_is_self_contained_and_escaped(tmp_path):
    fb = FakeBackend(responses=["<script>x", "a", "b"])
    state = plan.run(topic="<img src=x onerror=alert(1)>", backend=fb)
    path = tmp_path / "trace.html"
    doc = state.trace().to_html(path)
    assert path.read_text() == doc
    assert "<script" not in doc and "<img" not in doc  # user text only as escaped text
    assert "&lt;script&gt;x" in doc and "&lt;img src=x" in doc
    assert "http" not in doc.replace('http-equiv', '')  # nothing loaded from elsewhere
    assert doc.count('class="node gen"') == 3 and 'class="node select"' in doc


def test_trace_records_a_failing_program():
    fb = FakeBackend(fail_with=RuntimeError("backend down"))

    @sgl.function
    def one(s):
        s += "x" + sgl.gen("a", max_tokens=2)

    state = one.run(backend=fb)
    assert "backend down" in state.trace().error


def test_tokens_by_origin_from_meta_info():
    assert tokens_by_origin({"prompt_tokens": 10, "cached_tokens": 12, "completion_tokens": 7,
                             "jump_forward_tokens": 3}) == {"cached": 10, "prefilled": 0, "sampled": 4,
                                                            "jump_forward": 3}
    assert tokens_by_origin(None) == {} and tokens_by_origin({"text": "x"}) == {}
