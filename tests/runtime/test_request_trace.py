"""RequestTrace (engine side of a request trace): output origins through jump-forward rollbacks, token texts decoded
once, and what each output carries (live: everything; final: everything only with the final output)."""

from types import SimpleNamespace

from sglpy.runtime.engine.request_trace import RequestTrace


class CountingTokenizer:
    def __init__(self):
        self.calls = 0

    def decode(self, ids):
        self.calls += 1
        return "".join(chr(96 + i) for i in ids)


def test_origins_follow_jumps_and_rollbacks():
    t = RequestTrace()
    t.jumped(0, 3)  # a forced opening
    assert t.origins(5) == "jjjss"
    t.jumped(5, 2)
    assert t.origins(8) == "jjjssjjs"
    t.jumped(4, 3)  # re-tokenization rolled back position 4 (sampled) and the jump after it
    assert t.origins(7) == "jjjsjjj" and t.origins(9) == "jjjsjjjss"
    assert t.origins(2) == "jj"  # an output cut short (overlap placeholder dropped)


def test_pieces_are_decoded_once_and_redone_after_a_rollback():
    tok, t = CountingTokenizer(), RequestTrace()
    assert t.pieces([1, 2, 3], tok) == ["a", "b", "c"] and tok.calls == 3
    assert t.pieces([1, 2, 3, 4], tok) == ["a", "b", "c", "d"] and tok.calls == 4
    assert t.pieces([1, 2, 5, 6], tok) == ["a", "b", "e", "f"] and tok.calls == 6


def test_final_mode_sends_the_trace_with_the_final_output_only():
    tok = CountingTokenizer()
    req = SimpleNamespace(input_ids=[1, 2], output_ids=[])
    final, live = RequestTrace(), RequestTrace(live=True)
    for n in range(1, 4):
        req.output_ids.append(n + 2)
        assert final.to_json(req, tok, final=False) == {}
        step = live.to_json(req, tok, final=False)
        assert step["output_pieces"] == [chr(96 + i + 2) for i in range(1, n + 1)] and "prompt_pieces" not in step
    out = final.to_json(req, tok, final=True)
    assert out["output_origins"] == "ssss"[:3] and out["prompt_pieces"] == ["a", "b"] and out["prompt_ids"] == [1, 2]
    assert [s[1] for s in out["steps"]] == [1, 2, 3, 3]  # every step is timed, even those that sent nothing


def test_token_texts_are_capped():
    from sglpy.runtime.engine.request_trace import MAX_PIECES

    tok = CountingTokenizer()
    req = SimpleNamespace(input_ids=[1] * (MAX_PIECES + 10), output_ids=[2] * (MAX_PIECES + 3))
    out = RequestTrace().to_json(req, tok, final=True)
    assert len(out["prompt_pieces"]) == len(out["output_pieces"]) == MAX_PIECES
    assert len(out["output_origins"]) == MAX_PIECES + 3
