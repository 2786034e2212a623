"""JSON numbers as automata: the number texts we generate, exact ranges under float parsing, multipleOf residues.

Number texts in generated output: integers `-?(0|[1-9][0-9]*)` (any size: Python parses them exactly) and
decimals `-?(0|[1-9][0-9]*)\\.[0-9]+` with at most 15 digits in all (no exponent). Fifteen digits survive the
round trip through a double, so comparisons of such decimals with a schema bound b after `json.loads` are
exactly decimal comparisons with repr(b) (or with b's exact binary value when repr(b) needs more digits).
Inside that universe every range, `type: integer` and integer `multipleOf` is exact (so it can be negated).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from .dfa import DEAD, ByteDFA, _minimise, _trim, regex_to_dfa
from .errors import GrammarError
from .json_formats import integer_range

MAX_DIGITS = 15
INT_RE = r"(?:0|-?[1-9][0-9]*)"
_UINT = r"(?:0|[1-9][0-9]*)"
# decimals with a fraction and at most MAX_DIGITS digits in all
DEC_RE = "-?(?:" + "|".join(
    (r"0" if k == 1 else f"[1-9][0-9]{{{k - 2}}}" if k > 2 else "[1-9]") + rf"\.[0-9]{{1,{MAX_DIGITS - k}}}"
    for k in range(1, MAX_DIGITS)) + ")"
NUMBER_RE = f"(?:{INT_RE}|{DEC_RE})"
ZERO_FRAC_RE = r"-?(?:0|[1-9][0-9]*)\.0+"  # integral decimals such as 3.0 (integers in draft 6+); cut to 15 digits


def _as_fraction(b, for_decimals: bool) -> Fraction:
    """The value a ≤15-digit decimal (or an integer text) is effectively compared with after json.loads."""
    if isinstance(b, bool) or not isinstance(b, (int, float)) or (isinstance(b, float) and not math.isfinite(b)):
        raise GrammarError(f"numeric bound must be a finite number, got {b!r}")
    if isinstance(b, int):
        return Fraction(b)
    if for_decimals:
        r = repr(b)
        mant = r.lower().split("e")[0].replace("-", "").replace(".", "").lstrip("0")
        if len(mant) <= MAX_DIGITS:
            return Fraction(r)
    return Fraction(b)


def _frac_digits(f: Fraction, k: int, up: bool) -> Fraction:
    """f rounded to k fraction digits (up = ceiling)."""
    scaled = f * 10**k
    n = math.ceil(scaled) if up else math.floor(scaled)
    return Fraction(n, 10**k)


def _decimal_str(f: Fraction) -> tuple[str, str]:
    """(integer digits, fraction digits without trailing zeros) of a non-negative Fraction with a 10^k denominator."""
    n, d = f.numerator, f.denominator
    k = 0
    while 10**k % d:
        k += 1
    digits = str(n * (10**k // d)).rjust(k + 1, "0")
    ip, fp = digits[: len(digits) - k] if k else digits, digits[len(digits) - k :] if k else ""
    return ip.lstrip("0") or "0", fp.rstrip("0")


def _frac_gt(F: str) -> str:
    """Regex for fraction digit strings f with 0.f > 0.F (F without trailing zeros)."""
    if not F:
        return "[0-9]*[1-9][0-9]*"
    alts = [F[:i] + f"[{int(c) + 1}-9]" + "[0-9]*" for i, c in enumerate(F) if c != "9"]
    alts.append(F + "[0-9]*[1-9][0-9]*")
    return "(?:" + "|".join(alts) + ")"


def _mag(D: Fraction, strict: bool) -> str:
    """Unsigned texts `ip.fp` (fraction present) with value > D (strict) or >= D; D >= 0 a finite decimal."""
    I, F = _decimal_str(D)
    alts = [f"(?:{integer_range(int(I) + 1, None)})" + r"\.[0-9]+", I + r"\." + _frac_gt(F)]
    if not strict:
        alts.append(I + r"\." + (F + "0*" if F else "0+"))
    return "(?:" + "|".join(alts) + ")"


_UDEC = _UINT + r"\.[0-9]+"


def _gt_set(B: Fraction, strict: bool, max_states: int, budget) -> ByteDFA:
    """Signed decimal texts (fraction present) x with x > B (strict) or x >= B; B a finite decimal."""
    from .fsa import product

    if B > 0:
        return regex_to_dfa(_mag(B, strict), max_states, budget=budget)
    if B == 0:
        return regex_to_dfa(_mag(B, True) if strict else f"(?:{_UDEC}|-0" + r"\.0+)", max_states, budget=budget)
    neg_all = regex_to_dfa(f"-{_UDEC}", max_states, budget=budget)
    neg_fail = regex_to_dfa("-" + _mag(-B, not strict), max_states, budget=budget)
    neg_ok = product(neg_all, neg_fail, "diff", max_states, budget, "a number range")
    return product(regex_to_dfa(_UDEC, max_states, budget=budget), neg_ok, "or", max_states, budget,
                   "a number range")


def decimal_range_dfa(lo, lo_excl: bool, hi, hi_excl: bool, max_states: int = 20_000, budget=None) -> ByteDFA:
    """Decimal texts (fraction present, at most 15 digits) within the bounds, as compared after json.loads."""
    from .fsa import product

    grid = MAX_DIGITS - 1  # our decimals have at most 14 fraction digits
    out = regex_to_dfa(DEC_RE, max_states, budget=budget)
    if lo is not None:
        B = _as_fraction(lo, True)
        R = _frac_digits(B, grid, up=True)
        gt = _gt_set(B, lo_excl, max_states, budget) if R == B else _gt_set(R, False, max_states, budget)
        out = product(out, gt, "and", max_states, budget, "a number range")
    if hi is not None:
        B = _as_fraction(hi, True)
        R = _frac_digits(B, grid, up=False)
        # x <= B == not (x > B); x < B == not (x >= B); off the grid both are not (x > floor(B))
        fail = _gt_set(B, not hi_excl, max_states, budget) if R == B else _gt_set(R, True, max_states, budget)
        out = product(out, fail, "diff", max_states, budget, "a number range")
    return out


def integer_bounds(lo, lo_excl: bool, hi, hi_excl: bool) -> tuple[int | None, int | None]:
    """Inclusive integer bounds equivalent to the schema bounds for integer texts (exact, Python int vs float)."""
    a = b = None
    if lo is not None:
        f = _as_fraction(lo, False)
        a = math.floor(f) + 1 if lo_excl else math.ceil(f)
    if hi is not None:
        f = _as_fraction(hi, False)
        b = math.ceil(f) - 1 if hi_excl else math.floor(f)
    return a, b


def residue_dfa(d: int, with_zero_fraction: bool) -> ByteDFA:
    """Integer texts divisible by d (d >= 1); with_zero_fraction also accepts `N.0`, `N.00`, ... (draft 6+ floats)."""
    if d < 1:
        raise GrammarError(f"multipleOf must be > 0, got {d}")
    # states: 0 dead, 1 start, 2 after '-', 3 after a leading '0', 4 '.', 5 '.0+', 6.. residues
    n = 6 + d
    t = np.zeros((n, 256), np.int32)
    acc = np.zeros(n, bool)
    dig = [ord(c) for c in "0123456789"]
    t[1, ord("-")] = 2
    t[1, ord("0")] = 3  # "-0" is not generated
    for s in (1, 2):
        for v in range(1, 10):
            t[s, dig[v]] = 6 + v % d
    acc[3] = True
    for r in range(d):
        for v in range(10):
            t[6 + r, dig[v]] = 6 + (r * 10 + v) % d
    acc[6] = True
    if with_zero_fraction:
        t[3, ord(".")] = 4
        t[6, ord(".")] = 4
        t[4, ord("0")] = 5
        t[5, ord("0")] = 5
        acc[5] = True
    cls = np.unique(t.T, axis=0, return_inverse=True)[1].reshape(-1)
    _, first = np.unique(cls, return_index=True)
    ct = t[:, first]
    ct, acc, init = _trim(ct, acc, 1)
    ct, acc, init = _minimise(ct, acc, init)
    return ByteDFA(np.ascontiguousarray(ct[:, cls]), acc, init)


