"""The regex front end is Python's `re` parser behind `regex.nfa.parse`: pin the node kinds the builder reads."""

import sys

import pytest

from sglpy.grammar.regex.nfa import parse, sre_c


def _ops(tree):
    out = []
    for op, av in tree:
        out.append(str(op))
        if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT):
            out.append(_ops(av[2]))
        elif op == sre_c.SUBPATTERN:
            out.append(_ops(av[3]))
        elif op == sre_c.BRANCH:
            out.append([_ops(a) for a in av[1]])
        elif op == sre_c.IN:
            out.append([str(o) for o, _ in av])
    return out


PINNED = {
    r"^ab$": ["AT", "LITERAL", "LITERAL", "AT"],
    r"a|bc": ["BRANCH", [["LITERAL"], ["LITERAL", "LITERAL"]]],
    r"[^a-c\d]": ["IN", ["NEGATE", "RANGE", "CATEGORY"]],
    r"(?:x.)*?": ["MIN_REPEAT", ["LITERAL", "ANY"]],
    r"(a){2,3}": ["MAX_REPEAT", ["SUBPATTERN", ["LITERAL"]]],
    r"[^x]": ["NOT_LITERAL"],
    r"a(?=b)": ["LITERAL", "ASSERT"],
    r"(a)\1": ["SUBPATTERN", ["LITERAL"], "GROUPREF"],
}


@pytest.mark.parametrize("pattern", sorted(PINNED))
def test_parser_output_is_pinned(pattern):
    assert sys.version_info[:2] >= (3, 10)
    assert _ops(parse(pattern)) == PINNED[pattern]


def test_parse_errors_are_grammar_errors():
    from sglpy.grammar import GrammarError

    with pytest.raises(GrammarError, match="invalid regex"):
        parse("(a")
