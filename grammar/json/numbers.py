"""JSON numbers as automata: the number texts we generate, exact ranges under float parsing, multipleOf residues.

Number texts in generated output: integers `-?(0|[1-9][0-9]*)` (any size: Python parses them exactly) and
decimals with at most 9 integer and 6 fraction digits (no exponent). Fifteen digits survive the
round trip through a double, so comparisons of such decimals with a schema bound b after `json.loads` are
exactly decimal comparisons with repr(b) (or with b's exact binary value when repr(b) needs more digits).
Inside that universe every range, `type: integer` and integer `multipleOf` is exact (so it can be negated).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from ..regex import regex_to_dfa
from ..regex.dfa import ByteDFA, _minimise, _trim
from ..errors import GrammarError
from . import automata
from .formats import ANY_NUMBER_RE, integer_range

MAX_DIGITS = 15
MAX_MULTIPLES = 20_000  # non-integer multipleOf between two bounds: enumerated exactly up to this many
MULTIPLES_WINDOW = 2_000  # past that (or with an open bound): this many multiples nearest 0 (a sound subset)
INT_DIGITS, FRAC_DIGITS = 9, 6  # decimals with a fraction: at most 9 + 6 = 15 digits
INT_RE = r"(?:0|-?[1-9][0-9]*)"
_UINT = r"(?:0|[1-9][0-9]*)"
DEC_RE = rf"-?(?:0|[1-9][0-9]{{0,{INT_DIGITS - 1}}})\.[0-9]{{1,{FRAC_DIGITS}}}"
ANY_DEC_RE = r"-?(?:0|[1-9][0-9]*)\.[0-9]+"
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
    from ..regex.fsa import product

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
    from ..regex.fsa import product

    grid = FRAC_DIGITS  # the fraction digits of generated decimals
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
    """Integer texts divisible by d (d >= 1); with_zero_fraction also accepts `N.0`, `N.00`, ... and `-0.0`, ...
    (floats: json.loads reads `-0.0` as -0.0, a multiple of every d)."""
    if d < 1:
        raise GrammarError(f"multipleOf must be > 0, got {d}")
    # states: 0 dead, 1 start, 2 after '-', 3 after a leading '0', 4 '.', 5 '.0+', 6.. residues, 6 + d after "-0"
    n = 7 + d
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
        t[2, ord("0")] = 6 + d  # "-0" alone is an integer text (not accepted here); "-0.0" is a float
        t[6 + d, ord(".")] = 4
    cls = np.unique(t.T, axis=0, return_inverse=True)[1].reshape(-1)
    _, first = np.unique(cls, return_index=True)
    ct = t[:, first]
    ct, acc, init = _trim(ct, acc, 1)
    ct, acc, init = _minimise(ct, acc, init)
    return ByteDFA(np.ascontiguousarray(ct[:, cls]), acc, init)


def _tightest(bounds: list, lower: bool):
    """(bound, exclusive) that implies the others (ties: the exclusive one), or (None, False)."""
    best = None
    for v, excl in bounds:
        f = _as_fraction(v, True)
        if best is None:
            best = (v, excl, f)
            continue
        bf = best[2]
        if (f > bf if lower else f < bf) or (f == bf and excl):
            best = (v, excl, f)
    return (None, False) if best is None else (best[0], best[1])


def _plain_decimal(v: float) -> str | None:
    """A finite float as a plain decimal text (no exponent) with at most 15 digits, else None."""
    from decimal import Decimal

    if not math.isfinite(v):
        return None
    text = format(Decimal(repr(v)), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".") if not v.is_integer() else text
    digits = sum(c.isdigit() for c in text)
    return text if digits <= MAX_DIGITS else None


def _long_decimals(conv) -> str:
    """Decimals outside the 9+6-digit universe: over-approximations keep them all (no exact float check)."""
    got = conv.dfa_cache.get("longdec")
    if got is None:
        from ..regex.fsa import product

        d = product(regex_to_dfa(ANY_DEC_RE, conv.max_states, budget=conv.budget),
                    regex_to_dfa(DEC_RE, conv.max_states, budget=conv.budget), "diff", conv.max_states,
                    conv.budget, "numbers")
        got = conv.dfa_cache["longdec"] = automata.atom(conv, d)
    return got


def float_text(conv, v: float) -> str | None:
    """Regex for the texts we emit for a float const/enum value (None: no exact text in our universe)."""
    import re

    if not math.isfinite(v):
        return None
    if v.is_integer():
        i = str(int(v))
        return f"(?:{i}|{i}\\.0)" if len(i) < MAX_DIGITS else i
    text = _plain_decimal(v)
    return None if text is None else re.escape(text)


def number_equal(conv, v) -> str | None:
    """Over-approximation of the texts whose value equals v (decimals past 15 digits round: all kept)."""
    import re

    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, int) or v.is_integer():
        i = str(int(v))
        exact = f"{re.escape(i)}(?:\\.0+)?" if i != "0" else "-?0(?:\\.0+)?"
    else:
        text = _plain_decimal(v)
        exact = None if text is None else re.escape(text) + "0*"
    return _long_decimals(conv) if exact is None else f"(?:{exact}|{_long_decimals(conv)})"


def number_re(conv, n, integer_only: bool, mode: str) -> str | None:
    key = ("number", repr((n.num_lo, n.num_hi, n.multiple_of)), integer_only, mode)
    if key not in conv.dfa_cache:  # one atom per distinct number constraint (repr tells 1 from 1.0)
        conv.dfa_cache[key] = _number_re(conv, n, integer_only, mode)
    return conv.dfa_cache[key]


def _number_re(conv, n, integer_only: bool, mode: str) -> str | None:
    from ..regex.fsa import intersect_all, product

    lo, lo_x = _tightest(n.num_lo, True)
    hi, hi_x = _tightest(n.num_hi, False)
    ints = [m for m in n.multiple_of if isinstance(m, int)]
    integral = [int(m) for m in n.multiple_of if isinstance(m, float) and m.is_integer()]
    fractional = [m for m in n.multiple_of if isinstance(m, float) and not m.is_integer()]
    what = "a number's range/multipleOf"
    if not n.num_lo and not n.num_hi and not n.multiple_of:
        if not integer_only:
            return ANY_NUMBER_RE
        if mode == "under":
            return INT_RE
        # over: "-0" is never generated as an integer, but numbers may be written so (json.loads: the int 0)
        if conv.draft == "4":
            return f"(?:{INT_RE}|-0)"
        return f"(?:{INT_RE}|-0|{ZERO_FRAC_RE}|{_long_decimals(conv)})"
    if fractional and mode == "under":
        return _enumerated(conv, n, lo, lo_x, hi, hi_x, fractional, integer_only)
    fractional = []  # over: dropping the float-division divisors keeps a superset
    parts = []
    # integer texts
    a, b = integer_bounds(lo, lo_x, hi, hi_x)
    if a is None or b is None or a <= b:
        rng = integer_range(a, b)
        if ints or integral:
            dfas = [regex_to_dfa(rng, conv.max_states, budget=conv.budget, what=what)]
            dfas += [residue_dfa(m, False) for m in ints + integral if m <= 10_000]
            if any(m > 10_000 for m in ints + integral):
                if mode == "under":
                    conv.refuse("multipleOf", "divisors above 10000 are not supported")
            if integral:  # float division: exact below 2**53, so stay within 15 digits
                cap = regex_to_dfa(r"-?[0-9]{1,15}", conv.max_states, budget=conv.budget)
                if mode == "under":
                    dfas.append(cap)
            d = intersect_all(dfas, conv.max_states, conv.budget, what)
            if integral and mode == "over":
                big = regex_to_dfa(r"-?[1-9][0-9]{15,}", conv.max_states, budget=conv.budget)
                d = product(d, big, "or", conv.max_states, conv.budget, what)
            parts.append(automata.atom(conv, d) if d.accepting.any() else None)
        else:
            parts.append(rng)
    # decimal texts (a fraction part): numbers, and draft 6+ integers written as N.0 (over only)
    want_dec = not integer_only or (mode == "over" and conv.draft != "4")
    if want_dec:
        if (ints or integral) and mode == "under":
            pass  # under: multiples are written as integers
        else:
            d = decimal_range_dfa(lo, lo_x, hi, hi_x, conv.max_states, conv.budget)
            if integer_only or ints or integral:
                zf = regex_to_dfa(ZERO_FRAC_RE, conv.max_states, budget=conv.budget)
                d = product(d, zf, "and", conv.max_states, conv.budget, what)
                for m in ints + integral:
                    if m <= 10_000:
                        d = product(d, residue_dfa(m, True), "and", conv.max_states, conv.budget, what)
            parts.append(automata.atom(conv, d) if d.accepting.any() else None)
    if want_dec and mode == "over":
        parts.append(_long_decimals(conv))
    if mode == "over" and (a is None or a <= 0) and (b is None or b >= 0):
        parts.append("-0")  # the integer 0 as numbers may write it (a multiple of every divisor)
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


def _enumerated(conv, n, lo, lo_x, hi, hi_x, divisors, integers_only: bool) -> str | None:
    """Non-integer multipleOf: the finitely many candidates in the bounds that jsonschema's check accepts."""
    import json
    import re
    from decimal import Decimal

    step = Decimal(repr(divisors[0]))
    k0 = None if lo is None else math.ceil(Decimal(repr(float(lo))) / step)
    k1 = None if hi is None else math.floor(Decimal(repr(float(hi))) / step)
    if k0 is None or k1 is None or k1 - k0 > MAX_MULTIPLES:
        w = MULTIPLES_WINDOW
        # float division is not a regular language: generate the window of multiples nearest 0 inside the
        # bounds (a sound subset of the valid numbers)
        c = min(max(0, -(1 << 200) if k0 is None else k0), (1 << 200) if k1 is None else k1)
        k0 = c - w // 2 if k0 is None else max(k0, c - w // 2)
        k1 = k0 + w if k1 is None else min(k1, k0 + w)
        conv.narrowed.add(f"multipleOf {divisors[0]}: the {w} multiples nearest 0 within the bounds")
    texts = []
    for k in range(k0, k1 + 1):
        conv.budget.check("multipleOf") if k % 1000 == 0 else None
        t = format((step * k).normalize(), "f")
        if integers_only and "." in t:
            continue
        x = json.loads(t)
        if not ((lo is None or (x > lo if lo_x else x >= lo)) and (hi is None or (x < hi if hi_x else x <= hi))):
            continue
        if sum(c.isdigit() for c in t) > MAX_DIGITS and "." in t:
            continue
        if all(_jsonschema_multiple(x, m) for m in divisors + list(n.multiple_of)):
            texts.append(re.escape(t))
    if not texts:
        return None
    return automata.atom(conv, regex_to_dfa("(?:" + "|".join(texts) + ")", conv.max_states, budget=conv.budget,
                                  what="multipleOf"))


def _jsonschema_multiple(x, m) -> bool:
    """jsonschema's multipleOf check (float division for float divisors)."""
    if isinstance(m, float):
        q = x / m
        try:
            return int(q) == q
        except OverflowError:
            return (Fraction(x) / Fraction(m)).denominator == 1
    return x % m == 0
