"""SGLang's `sglang.lang.ir` names: the program IR (sglpy/nodes.py), SglFunction (sglpy/function.py) and the dtype
regexes. sglpy's own modules import nodes.py; this module sits above them, so no import runs in a circle."""

from .function import SglFunction  # noqa: F401
from .nodes import *  # noqa: F401,F403

# the dtype regexes, re-exported from their one definition (grammar's DTYPE_REGEX; loaded on first access because
# the grammar package imports numpy)
_LAZY_NAMES = {"REGEX_INT": "int", "REGEX_FLOAT": "float", "REGEX_BOOL": "bool", "REGEX_STR": "str"}


def __getattr__(name: str):
    if name in _LAZY_NAMES:
        from sglpy.grammar import DTYPE_REGEX

        return DTYPE_REGEX[_LAZY_NAMES[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
