"""The three `select` decision methods, applied to per-choice token logprobs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class ChoicesDecision:
    """The chosen option and what `s.get_meta_info(name)` returns for it."""

    decision: str
    meta_info: dict = field(default_factory=dict)


def _logprob_values(entries: list) -> list[float]:
    """[logprob, token_id, text] triples -> floats (None, the first-token logprob, counts as 0)."""
    return [0.0 if e[0] is None else float(e[0]) for e in entries]


class ChoicesSamplingMethod:
    """Base: a callable picking one choice from its scored token window."""

    requires_unconditional_logprobs = False

    def __call__(self, *, choices: list[str], normalized_prompt_logprobs: list[float],
                 input_token_logprobs: list[list], output_token_logprobs: list[list],
                 unconditional_token_logprobs: Optional[list[list]] = None) -> ChoicesDecision:
        raise NotImplementedError

    def __repr__(self):
        return type(self).__name__


def _check(choices, normalized_prompt_logprobs, input_token_logprobs):
    if not choices:
        raise ValueError("select needs at least one choice")
    if not (len(choices) == len(normalized_prompt_logprobs) == len(input_token_logprobs)):
        raise ValueError("choices, normalized_prompt_logprobs and input_token_logprobs differ in length")


class TokenLengthNormalized(ChoicesSamplingMethod):
    """Highest mean logprob over the choice's tokens (SGLang's default; favours long options)."""

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs,
                 output_token_logprobs, unconditional_token_logprobs=None):
        _check(choices, normalized_prompt_logprobs, input_token_logprobs)
        best = max(range(len(choices)), key=lambda i: (normalized_prompt_logprobs[i], -i))
        return ChoicesDecision(choices[best], {
            "normalized_prompt_logprobs": list(normalized_prompt_logprobs),
            "input_token_logprobs": input_token_logprobs,
            "output_token_logprobs": output_token_logprobs,
        })


class GreedyTokenSelection(ChoicesSamplingMethod):
    """Compare choices token by token, keeping those tied with the column maximum."""

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs,
                 output_token_logprobs, unconditional_token_logprobs=None):
        _check(choices, normalized_prompt_logprobs, input_token_logprobs)
        rows = [_logprob_values(r) for r in input_token_logprobs]
        width = max(len(r) for r in rows)
        # Shorter choices are padded with their own mean so they stay comparable past their end.
        matrix = [r + [sum(r) / len(r) if r else 0.0] * (width - len(r)) for r in rows]
        alive = list(range(len(choices)))
        for col in range(width):
            top = max(matrix[i][col] for i in alive)
            alive = [i for i in alive if matrix[i][col] == top]
            if len(alive) == 1:
                break
        return ChoicesDecision(choices[alive[0]], {
            "normalized_prompt_logprobs": list(normalized_prompt_logprobs),
            "input_token_logprobs": input_token_logprobs,
            "output_token_logprobs": output_token_logprobs,
            "greedy_logprob_matrix": matrix,
        })


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    """Mean of (conditional - unconditional) logprob per token: corrects for a priori likely options."""

    requires_unconditional_logprobs = True

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs,
                 output_token_logprobs, unconditional_token_logprobs=None):
        _check(choices, normalized_prompt_logprobs, input_token_logprobs)
        if unconditional_token_logprobs is None or len(unconditional_token_logprobs) != len(choices):
            raise ValueError("unconditional_likelihood_normalized needs unconditional logprobs for every choice")
        scores = []
        for cond, uncond in zip(input_token_logprobs, unconditional_token_logprobs):
            if len(cond) != len(uncond):
                raise ValueError(f"conditional ({len(cond)}) and unconditional ({len(uncond)}) token counts differ")
            c, u = _logprob_values(cond), _logprob_values(uncond)
            scores.append(sum(a - b for a, b in zip(c, u)) / len(c) if c else float("-inf"))
        best = max(range(len(choices)), key=lambda i: (scores[i], -i))
        return ChoicesDecision(choices[best], {
            "normalized_prompt_logprobs": list(normalized_prompt_logprobs),
            "input_token_logprobs": input_token_logprobs,
            "output_token_logprobs": output_token_logprobs,
            "unconditional_token_logprobs": unconditional_token_logprobs,
            "normalized_unconditional_prompt_logprobs": scores,
        })


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
