"""KV pool sizing arithmetic (runtime/memory/sizing.py), checked without a GPU."""

import pytest

from sglpy.runtime.memory.sizing import GIB, kv_bytes_per_token, plan_kv_pool


def test_bytes_per_token():
    # Llama-3.2-1B in bf16: 16 layers x 8 kv heads x 64 dims x 2 (K and V) x 2 bytes
    assert kv_bytes_per_token(16, 8, 64, 2) == 32768


def test_plan_matches_sglang_rule():
    total, free = 80 * GIB, 77 * GIB  # 3 GiB of weights loaded
    plan = plan_kv_pool(total, free, 0.85, 32768)
    reserved = int(total * 0.15)
    assert plan.reserved_bytes == reserved
    assert plan.max_total_tokens == (free - reserved) // 32768
    assert plan.max_total_tokens * 32768 <= free - reserved < (plan.max_total_tokens + 1) * 32768
    assert "tokens" in plan.describe() and "GiB" in plan.describe()


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_bad_fraction(fraction):
    with pytest.raises(ValueError, match="mem_fraction_static"):
        plan_kv_pool(80 * GIB, 70 * GIB, fraction, 1024)


def test_nothing_left_is_a_clear_error():
    with pytest.raises(ValueError, match="no memory left for the KV cache"):
        plan_kv_pool(80 * GIB, 10 * GIB, 0.85, 32768)  # weights took 70 GiB; 12 GiB must stay free


def test_engine_config_validates_new_fields():
    from sglpy.runtime.config import EngineConfig

    for bad in (dict(mem_fraction_static=1.0), dict(cuda_graph_max_bs=0), dict(max_total_tokens=0),
                dict(disable_cuda_graph="yes"), dict(disable_overlap_schedule=1.5)):
        with pytest.raises(ValueError):
            EngineConfig(**bad)


def test_cli_flags_round_trip():
    from sglpy.runtime.server.config import config_from_args, config_to_args

    cfg = config_from_args(["--cuda-graph-max-bs", "48", "--disable-cuda-graph", "--no-disable-overlap-schedule",
                            "--mem-fraction-static", "0.7"])
    e = cfg.engine
    assert (e.cuda_graph_max_bs, e.disable_cuda_graph, e.disable_overlap_schedule, e.mem_fraction_static) == \
        (48, True, False, 0.7)
    assert e.max_total_tokens is None
    assert config_from_args(config_to_args(cfg)) == cfg
