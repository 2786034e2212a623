"""The exception types of the grammar package."""


class GrammarError(ValueError):
    """A constraint cannot be compiled: bad syntax, an unsupported construct/keyword, or a size/time limit."""


class CompileCancelled(GrammarError):
    """The compile was cancelled from outside (its cancel flag was set) before it finished."""
