"""API speculative execution (`@sgl.function(num_api_spec_tokens=N)`) on hosted-API backends, by SGLang's rules.

Chat models: inside an assistant turn the gens and the constant text between them are recorded, not sent;
when the turn closes one API call (max_tokens = N, no stop) answers the whole turn, and the answer is split
by the recorded text and each gen's stop strings (`match_turn`). A miss (the model left the format) falls back
to one call per gen, each continuing the assistant text so far (only where the backend can continue a partial
assistant message; otherwise it raises). Variables of a speculative turn are set when the turn closes.

Completion models: a gen with stop strings takes its value from text speculated by an earlier call when that
text holds one of its stops; otherwise one call with max_tokens = max(max_tokens, N) and no stop speculates
ahead. Constant text appended later must match the speculated text (it is consumed) or the speculation is
dropped; a gen whose stop is not found makes its own call.

Every gen of a speculative call must share its sampling parameters apart from stop and max_tokens, and carry
no constraint (regex, json_schema, ...): a constrained or differently sampled gen is an error, not a guess.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from .nodes import GenParams

SPEC_FREE_FIELDS = ("stop", "max_new_tokens")  # the fields gens of one speculative call may differ in
_CONSTRAINTS = ("regex", "json_schema", "ebnf", "choices", "structural_tag")


@dataclass
class SpecTerm:
    """One piece of a speculative assistant turn: constant text (params None) or a gen."""

    text: str = ""
    name: Optional[str] = None
    params: Optional[GenParams] = None

    @property
    def is_gen(self) -> bool:
        return self.params is not None


def earliest_stop(text: str, stops) -> int:
    """Position of the first occurrence of any stop string in `text` (-1 when none occurs)."""
    found = [p for p in (text.find(s) for s in stops if s) if p != -1]
    return min(found) if found else -1


def check_speculable(params: GenParams, where: str) -> None:
    """A gen may join a speculative call only without constraints, logprob options or n > 1."""
    sp = params.sampling
    bad = [f for f in _CONSTRAINTS if getattr(sp, f) is not None]
    if bad or sp.n != 1 or params.logprob_fields():
        what = bad[0] if bad else ("n > 1" if sp.n != 1 else "logprob options")
        raise ValueError(f"speculative execution (num_api_spec_tokens) {where}: a gen with {what} cannot be filled "
                         "from a speculative call; drop num_api_spec_tokens or the option")


def spec_params(gens: list[GenParams], num_tokens: int) -> GenParams:
    """The one call's parameters: the gens' shared sampling, max_tokens = num_tokens, no stop."""
    first = gens[0]
    for g in gens:
        check_speculable(g, "in an assistant turn")
    base = {f.name: getattr(first.sampling, f.name) for f in dataclasses.fields(first.sampling)
            if f.name not in SPEC_FREE_FIELDS}
    for g in gens[1:]:
        for name, value in base.items():
            if getattr(g.sampling, name) != value:
                raise ValueError(f"speculative execution (num_api_spec_tokens): every gen of an assistant turn must "
                                 f"share its sampling parameters; {name} differs ({value!r} vs "
                                 f"{getattr(g.sampling, name)!r})")
    return dataclasses.replace(first, sampling=dataclasses.replace(first.sampling, stop=(), max_new_tokens=num_tokens))


def match_turn(terms: list[SpecTerm], completion: str) -> Optional[list[str]]:
    """Each gen's value cut out of one completion of the turn; None when the model did not follow the format.

    Constant text must appear verbatim where the program puts it; a gen ends at its first stop string (the
    stop stays for the text that follows); the last gen takes the rest when none of its stops occurs.
    Constant text after the last gen is the program's own and need not be generated.
    """
    last_gen = max((i for i, t in enumerate(terms) if t.is_gen), default=-1)
    values, rest = [], completion
    for i, term in enumerate(terms[: last_gen + 1]):
        if not term.is_gen:
            if not rest.startswith(term.text):
                return None
            rest = rest[len(term.text):]
            continue
        pos = earliest_stop(rest, term.params.sampling.stop)
        if pos == -1:
            if i != last_gen:
                return None
            pos = len(rest)
        values.append(rest[:pos])
        rest = rest[pos:]
    return values


def completion_spec_params(params: GenParams, num_tokens: int) -> GenParams:
    """A completion model's speculative call: no stop, max_tokens = max(the gen's, num_tokens)."""
    mnt = params.sampling.max_new_tokens
    budget = num_tokens if mnt is None else max(mnt, num_tokens)
    return dataclasses.replace(params, sampling=dataclasses.replace(params.sampling, stop=(), max_new_tokens=budget))


def speculable_completion_gen(params: GenParams) -> bool:
    """Completion models speculate only for plain gens with stop strings (a gen without stops makes its own call)."""
    sp = params.sampling
    return (bool(sp.stop) and sp.n == 1 and not params.logprob_fields()
            and all(getattr(sp, f) is None for f in _CONSTRAINTS))


# ---------------------------------------------------------------- run on an interpreter.StreamExecutor


def speculated_gen(ex, node, params: GenParams) -> bool:
    """Completion models: the executor `ex` takes a gen's value from speculated text (one call ahead); False on a miss."""
    meta: dict = {"api_spec": "reused"}
    if not ex.spec_text:
        res = ex.backend.generate(ex.text_, completion_spec_params(params, ex.num_api_spec_tokens))
        ex.spec_text, meta = res.text, {**res.meta_info, "api_spec": "called"}
    pos = earliest_stop(ex.spec_text, params.sampling.stop)
    if pos == -1:  # the stop never came: this gen makes its own call
        ex.spec_text = ""
        return False
    value, ex.spec_text = ex.spec_text[:pos], ex.spec_text[pos:]
    ex._append(value, node.name, speculated=True)
    ex._finish_var(node.name, value, meta)
    return True


def run_spec_turn(ex) -> None:
    """Chat models: answer the executor `ex`'s recorded assistant turn with one call, or one call per gen on a miss."""
    terms, ex.spec_turn = ex.spec_turn, None
    gens = [t for t in terms if t.is_gen]
    if not gens:
        for t in terms:
            ex._append(t.text)
        return
    messages = list(ex.messages_)
    res = ex.backend.generate_chat(messages, spec_params([t.params for t in gens], ex.num_api_spec_tokens))
    values = match_turn(terms, res.text)
    if values is not None:
        it = iter(values)
        for t in terms:
            if t.is_gen:
                t.text = next(it)
                ex._reset_buffer(t.name)
                ex._append(t.text, t.name)
                ex._finish_var(t.name, t.text, {**res.meta_info, "api_spec": "hit"})
            else:
                ex._append(t.text)
        return
    for t in terms:  # a miss: one call per gen, each continuing the turn's text so far
        if not t.is_gen:
            ex._append(t.text)
            continue
        partial = ex.text_[ex.cur_role_begin_pos:].lstrip()
        one = ex.backend.generate_chat(messages, t.params, partial)
        ex._reset_buffer(t.name)
        ex._append(one.text, t.name)
        ex._finish_var(t.name, one.text, {**one.meta_info, "api_spec": "miss"})
