"""The exception types of the grammar package."""


class GrammarError(ValueError):
    """A constraint cannot be compiled: bad syntax, an unsupported construct/keyword, or a size/time limit."""


class CompileCancelled(GrammarError):
    """The compile was cancelled from outside (its cancel flag was set) before it finished."""


class BudgetExceeded(GrammarError):
    """The compile ran past its time budget (CompileBudget.time_s)."""


def too_large(what: str, max_states: int) -> GrammarError:
    """The error of an automaton that grows past max_states, naming what was being built."""
    return GrammarError(f"automaton too large: {what} needs more than {max_states} DFA states "
                        "(raise max_states, or simplify the constraint)")


def is_fatal(e: Exception) -> bool:
    """Errors that end the whole compile (time budget, cancellation), as opposed to one construct's refusal."""
    return isinstance(e, (BudgetExceeded, CompileCancelled))
