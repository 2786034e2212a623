"""The one exception type of the grammar package."""


class GrammarError(ValueError):
    """A constraint cannot be compiled: bad syntax, an unsupported construct/keyword, or a size limit."""
