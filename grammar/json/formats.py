"""Regexes for JSON scalar types, string formats and integer ranges (used by the JSON-schema converter)."""

from __future__ import annotations

from ..errors import GrammarError

STRING_CHAR = r'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt])'
STRING = r'"' + STRING_CHAR + r'*"'
ANY_NUMBER_RE = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?"  # unconstrained numbers: fraction of any length
INTEGER = r"(?:0|-?[1-9][0-9]*)"
BOOLEAN = r"(?:true|false)"
NULL = r"null"

_LEAP_YEAR = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_YEAR = r"(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"  # 0001-9999: Python's date range
_DATE = (
    r"(?:" + _YEAR + r"-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    r"|02-(?:0[1-9]|1[0-9]|2[0-8]))|" + _LEAP_YEAR + r"-02-29)"
)
_TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_URI_CHARS = r"[A-Za-z0-9._~%!$&'()*+,;=:@-]"
_HLABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,20}[A-Za-z0-9])?"
_H16 = r"[0-9a-fA-F]{1,4}"
_DUR_DATE = r"[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?|[0-9]+M(?:[0-9]+D)?|[0-9]+D"
_DUR_TIME = r"T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)"

# Content of the JSON string (between the quotes), all plain ASCII without characters JSON must escape.
FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": _DATE + "T" + _TIME,
    "email": r"[A-Za-z0-9._%+-]+@" + _LABEL + r"(?:\." + _LABEL + r")*\.[A-Za-z]{2,}",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "uri": r"(?:https?|ftp)://[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*(?::[0-9]{1,5})?(?:/" + _URI_CHARS + r"*)*"
    r"(?:\?(?:" + _URI_CHARS + r"|[/?])*)?(?:#(?:" + _URI_CHARS + r"|[/?])*)?",
    "ipv4": r"(?:" + _OCTET + r"\.){3}" + _OCTET,
    # labels of at most 22 characters and 5 labels keep every name under RFC 1123's 253 characters
    "hostname": _HLABEL + r"(?:\." + _HLABEL + r"){0,4}",
    "ipv6": r"(?:" + _H16 + r":){7}" + _H16 + r"|(?:" + _H16 + r"(?::" + _H16 + r"){0,2})?::(?:" + _H16
            + r"(?::" + _H16 + r"){0,2})?",
    "duration": r"P(?:(?:" + _DUR_DATE + r")(?:" + _DUR_TIME + r")?|" + _DUR_TIME + r"|[0-9]+W)",
}
FORMATS["uri-reference"] = "(?:" + FORMATS["uri"] + r"|/?(?:[A-Za-z0-9._~-]+/)*[A-Za-z0-9._~-]*"  \
    r"(?:\?[A-Za-z0-9._~=&-]*)?(?:#[A-Za-z0-9._~-]*)?)"


def _same_length(x: str, y: str) -> list[str]:
    """Alternatives matching digit strings of len(x) between x and y (leading zeros allowed)."""
    n = len(x)
    if n == 0:
        return [""]
    if x == y:
        return [x]
    if n == 1:
        return [f"[{x}-{y}]"]
    if x[1:] == "0" * (n - 1) and y[1:] == "9" * (n - 1):
        return [f"[{x[0]}-{y[0]}][0-9]{{{n - 1}}}"]
    if x[0] == y[0]:
        return [x[0] + r for r in _group(_same_length(x[1:], y[1:]))]
    out = [x[0] + r for r in _group(_same_length(x[1:], "9" * (n - 1)))]
    lo, hi = int(x[0]) + 1, int(y[0]) - 1
    if lo <= hi:
        out.append(f"[{lo}-{hi}][0-9]{{{n - 1}}}")
    out += [y[0] + r for r in _group(_same_length("0" * (n - 1), y[1:]))]
    return out


def _group(alts: list[str]) -> list[str]:
    return [alts[0]] if len(alts) == 1 else ["(?:" + "|".join(alts) + ")"]


def _naturals(a: int, b: int | None) -> list[str]:
    """Alternatives for the integers a..b (b None = unbounded), a >= 0, canonical decimal form."""
    out: list[str] = []
    if b is not None and a > b:
        return out
    da = len(str(a))
    top = 10**da - 1
    if b is not None and b <= top:
        return _same_length(str(a), str(b))
    out += _same_length(str(a), str(top))
    if b is None:
        out.append(f"[1-9][0-9]{{{da},}}")
        return out
    for d in range(da + 1, len(str(b))):
        out.append(f"[1-9][0-9]{{{d - 1}}}")
    out += _same_length(str(10 ** (len(str(b)) - 1)), str(b))
    return out


def integer_range(lo: int | None, hi: int | None) -> str:
    """Regex for the canonical decimal integers in [lo, hi] (None = unbounded); GrammarError if empty."""
    if lo is None and hi is None:
        return INTEGER
    if lo is not None and hi is not None and lo > hi:
        raise GrammarError(f"integer range is empty: minimum {lo} > maximum {hi}")
    alts: list[str] = []
    if lo is None or lo < 0:  # negative part: -(max(1,-hi) .. -lo)
        neg_lo = 1 if hi is None or hi >= 0 else -hi
        neg_hi = None if lo is None else -lo
        alts += ["-" + r for r in _group(_naturals(neg_lo, neg_hi))]
    if hi is None or hi >= 0:
        alts += _naturals(max(lo or 0, 0), hi)
    return "(?:" + "|".join(alts) + ")"
