"""Quality gate: teacher-forced perplexity of our model per quantization / KV-cache mode, and top-1 agreement with fp32.

python benchmarks/quality_gate.py [--modes none,int8,int4,none:bf16,int8:bf16] [--tokens 1024]
                                  [--decode-tokens 512] [--threads 2] [--model PATH] [--json out.json]

A mode is `quantization[:kv_cache_dtype]`. The text (benchmarks/data/quality_text.txt, an essay written
for this repo, ~1,100 tokens) goes through OUR runtime model (ModelRunner, not HF): one prefill forward
scores the first positions (the many-row matmul path), then decode steps score the last decode_tokens
positions one token per forward (the one-row packed kernels, decode attention over the KV pool).
Every position scores the next token. A mode ships only with perplexity within 2% of float32 and top-1
agreement with float32 >= 93%, both over all positions.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time
from dataclasses import asdict, dataclass

import torch

TEXT_PATH = pathlib.Path(__file__).resolve().parent / "data" / "quality_text.txt"
PPL_TOLERANCE = 0.02  # perplexity at most 2% above float32
MIN_AGREEMENT = 0.93  # top-1 next-token agreement with float32


@dataclass(frozen=True)
class Scores:
    """Per scored position: next-token NLL and the argmax token; plus how many came from decode steps."""

    nll: torch.Tensor  # [n - 1] float64
    top1: torch.Tensor  # [n - 1] int64
    num_decode: int  # the last num_decode positions were scored by decode steps
    seconds: float


@dataclass(frozen=True)
class GateResult:
    """One mode's verdict against float32 on the same text."""

    mode: str
    perplexity: float
    ref_perplexity: float
    ppl_increase: float  # relative, e.g. 0.004 = +0.4%
    agreement: float  # over all positions
    prefill_agreement: float
    decode_agreement: float
    passed: bool
    seconds: float


def parse_mode(mode: str) -> dict:
    """'int8:bf16' -> {'quantization': 'int8', 'kv_cache_dtype': 'bf16'}."""
    quant, _, kv = mode.partition(":")
    return {"quantization": quant or "none", "kv_cache_dtype": kv or "auto"}


def text_ids(tokenizer, n_tokens: int) -> list[int]:
    """The first n_tokens tokens of the shipped text."""
    ids = tokenizer.encode(TEXT_PATH.read_text(encoding="utf-8"))
    if len(ids) < n_tokens:
        raise ValueError(f"the text has {len(ids)} tokens, fewer than the {n_tokens} asked for")
    return ids[:n_tokens]


@torch.inference_mode()
def teacher_forced_scores(runner, ids: list[int], decode_tokens: int, kv_cache_dtype: str = "auto") -> Scores:
    """Score every next token of ids: a prefill of the first part, then one decode step per token."""
    from sglpy.runtime.core import BatchEntry, Req
    from sglpy.runtime.sampling_params import LogprobOptions, SamplingParams
    from sglpy.runtime.testing.runner_kv import runner_kv

    n = len(ids)
    p = n - 1 - decode_tokens  # the prefill scores positions 0 .. p-1, decode steps p .. n-2
    if not 1 <= p <= n - 1:
        raise ValueError(f"decode_tokens must be in [0, {n - 2}], got {decode_tokens}")
    kv = runner_kv(runner, n, 1, kv_cache_dtype)
    req = Req(rid="gate", input_ids=list(ids[:p]), sampling=SamplingParams(max_new_tokens=1),
              logprob=LogprobOptions(return_logprob=True, logprob_start_len=0))
    if not (kv.assign_row(req) and kv.grow(req, p)):
        raise ValueError("the runner has no room for the text: raise max_context_len")
    target = torch.tensor(ids[1:])
    nll, top1 = [], []

    def score(logits: torch.Tensor, first: int) -> None:
        # logits: [m, vocab] at positions first .. first + m - 1; scores the tokens one further on
        logits = logits[: n - 1 - first].double()
        tgt = target[first: first + logits.shape[0]]
        nll.append(torch.logsumexp(logits, -1) - logits.gather(1, tgt[:, None])[:, 0])
        top1.append(logits.argmax(-1))

    t0 = time.perf_counter()
    try:
        out = runner.forward([BatchEntry(req, 0, p, sample=True)], 0, kv.buffers)
        score(out.logits[list(out.input_rows[0]) + [out.sample_row[0]]], 0)
        req.logprob = LogprobOptions()  # the prompt is scored; teacher-forced steps need only their logits
        for t in range(p, n - 1):
            req.output_ids.append(ids[t])  # teacher forcing: the text's token, not a sampled one
            assert kv.grow(req, 1)
            out = runner.forward([BatchEntry(req, t, 1, sample=True)], 1, kv.buffers)
            score(out.logits[[out.sample_row[0]]], t)
    finally:
        kv.release(req)
    return Scores(torch.cat(nll), torch.cat(top1), decode_tokens, time.perf_counter() - t0)


def judge(mode: str, s: Scores, ref: Scores) -> GateResult:
    """Compare a mode's scores with float32's: perplexity increase and top-1 agreement, and the verdict."""
    ppl, ref_ppl = math.exp(s.nll.mean().item()), math.exp(ref.nll.mean().item())
    same = (s.top1 == ref.top1).double()
    d = s.num_decode
    pre, dec = (same[:-d], same[-d:]) if d else (same, same[:0])
    agreement = same.mean().item()
    increase = ppl / ref_ppl - 1.0
    return GateResult(mode, ppl, ref_ppl, increase, agreement, pre.mean().item() if pre.numel() else float("nan"),
                      dec.mean().item() if dec.numel() else float("nan"),
                      increase <= PPL_TOLERANCE and agreement >= MIN_AGREEMENT, s.seconds)


def run_gate(model_path: str, modes: list[str], n_tokens: int = 1024, decode_tokens: int = 512) -> list[GateResult]:
    """Score float32 and each mode on the shipped text; returns one GateResult per mode (float32 first)."""
    from transformers import AutoTokenizer

    from sglpy.runtime.config import EngineConfig
    from sglpy.runtime.model.runner import ModelRunner

    ids = text_ids(AutoTokenizer.from_pretrained(model_path), n_tokens)
    runners: dict[str, ModelRunner] = {}  # one load per quantization: the KV dtype is only the scoring pool's

    def scores(mode: str) -> Scores:
        cfg = EngineConfig(model=model_path, device="cpu", max_total_tokens=n_tokens + 16, max_running_requests=2,
                           max_context_len=max(n_tokens + 16, 64), **parse_mode(mode))
        if cfg.quantization not in runners:
            runners[cfg.quantization] = ModelRunner(cfg, model_path)
        return teacher_forced_scores(runners[cfg.quantization], ids, decode_tokens, cfg.kv_cache_dtype)

    ref = scores("none")
    results = [judge("none", ref, ref)]
    for mode in modes:
        if parse_mode(mode) != parse_mode("none"):
            results.append(judge(mode, scores(mode), ref))
    return results


def format_table(results: list[GateResult]) -> str:
    """The gate's table, one row per mode."""
    lines = [f"{'mode':<12}{'ppl':>9}{'vs fp32':>9}{'top-1 agree':>13}{'prefill':>9}{'decode':>9}{'sec':>7}  verdict"]
    for r in results:
        lines.append(f"{r.mode:<12}{r.perplexity:>9.3f}{r.ppl_increase * 100:>+8.2f}%{r.agreement * 100:>12.1f}%"
                     f"{r.prefill_agreement * 100:>8.1f}%{r.decode_agreement * 100:>8.1f}%{r.seconds:>7.1f}  "
                     f"{'PASS' if r.passed else 'FAIL'}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="int8,int4,none:bf16,none:fp16,int8:bf16,int4:bf16")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--decode-tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None, help="HF folder; default: the embedded model")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from sglpy.runtime.model.loader import resolve_model_path

    path = resolve_model_path(args.model)
    results = run_gate(path, args.modes.split(","), args.tokens, args.decode_tokens)
    print(f"model {path}; {args.tokens} tokens of {TEXT_PATH.name}, the last {args.decode_tokens} scored by "
          f"decode steps; gate: ppl <= +{PPL_TOLERANCE:.0%}, agreement >= {MIN_AGREEMENT:.0%}")
    print(format_table(results))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
