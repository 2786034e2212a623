"""Jump-forward's shortest-jump policy: short jumps are left to decode, a jump that ends the request always applies."""

import re

import pytest

from sglpy.runtime.config import JUMP_MIN_TOKENS_GRAPHS, EngineConfig
from sglpy.runtime.engine import Engine
from sglpy.runtime.engine.constrained import jump_min_tokens

# after the sampled digit a long literal is forced mid-output; after the sampled letter the final "." is forced
RX = r"[0-9] is the answer to the question, and that is all [a-z]\."


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    eng = Engine(tiny_model_path, max_total_tokens=4096, debug_invariants=True, quantization="none",
                 jump_forward_min_tokens=100)
    yield eng
    eng.shutdown()


def test_auto_is_one_unless_a_jump_would_take_the_step_off_the_graphs():
    assert jump_min_tokens(EngineConfig(), graphs_captured=False) == 1
    assert jump_min_tokens(EngineConfig(), graphs_captured=True) == 1  # jumped spans ride the multi-token graphs
    no_extend_graphs = EngineConfig(cuda_graph_extend_tokens=1)
    assert jump_min_tokens(no_extend_graphs, graphs_captured=True) == JUMP_MIN_TOKENS_GRAPHS > 1
    assert jump_min_tokens(EngineConfig(jump_forward_min_tokens=3), graphs_captured=True) == 3
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="jump_forward_min_tokens"):
            EngineConfig(jump_forward_min_tokens=bad)


def _run(engine, min_jump):
    engine.constrained.min_jump_tokens = min_jump
    steps = engine.get_server_info()["num_steps"]
    out = engine.generate("Q:", {"regex": RX, "temperature": 0, "max_new_tokens": 60})
    return out, engine.get_server_info()["num_steps"] - steps


def test_short_jumps_are_decoded_and_ending_jumps_still_apply(engine):
    assert engine.constrained.min_jump_tokens == 100  # from the config
    long_out, long_steps = _run(engine, 100)
    jump_out, jump_steps = _run(engine, 1)
    for out in (long_out, jump_out):
        assert re.fullmatch(RX, out["text"]), out["text"]
    # min 1: the mid-output literal is jumped; min 100: only the jump that ends the request (the final ".",
    # re-tokenized with the letters before it) is applied
    assert jump_out["meta_info"]["jump_forward_tokens"] > 5
    assert 1 <= long_out["meta_info"]["jump_forward_tokens"] <= 3
    assert long_out["output_ids"][-1] == engine.tokenizer.encode(".", add_special_tokens=False)[-1]
    assert long_steps > jump_steps + 4  # the literal took one decode step per token
    info = engine.get_server_info()
    assert info["kv_used"] == 0 and info["num_running_reqs"] == 0, info
