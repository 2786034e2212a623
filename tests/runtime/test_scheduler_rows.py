"""Which rows a token rides: under deterministic inference a prompt token is never a decode row, however the
prompt is chunked (the decode and extend attention kernels reduce in different orders on CUDA)."""

import pytest


def _rows_of_prompt_tokens(path, det: bool, chunk: int, prompt: list[int]) -> list[str]:
    """'decode' or 'extend' for each forward row that held one of the prompt's tokens."""
    from sglpy.runtime.engine import Engine

    eng = Engine(path, max_total_tokens=2048, quantization="none", chunked_prefill_size=chunk,
                 enable_deterministic_inference=det)
    seen = []
    forward = eng.runner.forward

    def spy(entries, num_decode, *a, **k):
        for i, e in enumerate(entries):
            if e.prefix_len < len(e.req.input_ids):
                seen.append("decode" if i < num_decode else "extend")
        return forward(entries, num_decode, *a, **k)

    eng.runner.forward = spy
    try:
        out = eng.generate(input_ids=prompt, sampling_params={"max_new_tokens": 3, "temperature": 0})
    finally:
        eng.shutdown()
    assert len(out["output_ids"]) == 3
    return seen


@pytest.mark.parametrize("det", [False, True])
def test_a_prompts_last_chunk_of_one_token(tiny_model_path, det):
    prompt = [5 + (7 * i) % 90 for i in range(33)]  # chunks of 16: 16, 16, then the last token alone
    rows = _rows_of_prompt_tokens(tiny_model_path, det, 16, prompt)
    assert rows == ["extend", "extend", "extend" if det else "decode"], rows
