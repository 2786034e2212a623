"""The exception types of the grammar package."""


class GrammarError(ValueError):
    """A constraint cannot be compiled: bad syntax, an unsupported construct/keyword, or a size/time limit."""


class CompileCancelled(GrammarError):
    """The compile was cancelled from outside (its cancel flag was set) before it finished."""


class BudgetExceeded(GrammarError):
    """The compile ran past its time budget (CompileBudget.time_s)."""


def is_fatal(e: Exception) -> bool:
    """Errors that end the whole compile (time budget, cancellation), as opposed to one construct's refusal."""
    return isinstance(e, (BudgetExceeded, CompileCancelled))
