"""EBNF (lark) guides: walks parse with lark, EOS <=> lark accepts, forced strings, bad grammars."""

import json
import random
import time

import lark
import pytest

from sglpy.grammar import GrammarCompiler, GrammarError
from sglpy.grammar.testing import random_walk, small_vocab_info

INFO = small_vocab_info()
COMPILER = GrammarCompiler(INFO)

JSON_G = r"""
start: object
?value: object | array | STRING | NUMBER | "true" | "false" | "null"
array: "[" [value (", " value)*] "]"
object: "{" [pair (", " pair)*] "}"
pair: STRING ": " value
STRING: /"([^"\\\x00-\x1f]|\\["\\\/bfnrt])*"/
NUMBER: /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/
"""
ARITH_G = r"""
?start: sum
?sum: product | sum "+" product | sum "-" product
?product: atom | product "*" atom | product "/" atom
?atom: NUMBER | "-" atom | "(" sum ")"
NUMBER: /[0-9]+(\.[0-9]+)?/
%ignore " "
"""
SQL_G = r"""
start: "SELECT " cols " FROM " NAME [" WHERE " cond] [" LIMIT " INT]
cols: "*" | NAME (", " NAME)*
cond: NAME OP value (" AND " NAME OP value)*
value: INT | STR
STR: /'[a-z ]*'/
OP: " = " | " < " | " > "
NAME: /[a-z_][a-z0-9_]*/
INT: /[0-9]+/
"""
GRAMMARS = {"json": JSON_G, "arith": ARITH_G, "sql": SQL_G}
PREFER = frozenset(i for i, b in enumerate(INFO.token_bytes) if b in (b'"', b"}", b"]", b")", b"1", b"a"))


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_walks_parse_and_eos_matches_lark(name):
    grammar = GRAMMARS[name]
    guide = COMPILER.compile_ebnf(grammar)
    parser = lark.Lark(grammar, parser="lalr")
    rng = random.Random(7)
    finished = 0
    for _ in range(25):
        walk = random_walk(guide, rng, max_steps=80, eos_bias=0.5, prefer=PREFER, prefer_bias=0.3)
        data = b""
        for state, tok in zip(walk.states, walk.tokens):
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                text = None
            if text is not None:
                try:
                    parser.parse(text)
                    ok = True
                except lark.exceptions.LarkError:
                    ok = False
                assert guide.is_final(state) == ok, (name, text)
            if tok not in INFO.eos_token_ids:
                data += INFO.token_bytes[tok]
        if walk.finished:
            finished += 1
            parser.parse(walk.data.decode("utf-8"))
            if name == "json":
                assert isinstance(json.loads(walk.data), dict)
    assert finished >= 5


def test_forced_strings_and_api():
    g = COMPILER.compile_ebnf(SQL_G)
    s = g.initial_state
    assert g.forced_string(s) == "SELECT "
    s = g.advance_bytes(s, b"SELECT * FROM t")
    assert g.is_final(s) and g.can_continue(s)
    s2 = g.advance_bytes(s, b" W")
    assert g.forced_string(s2) == "HERE "
    with pytest.raises(ValueError, match="not allowed"):
        g.advance_bytes(s, b"!")
    ids = {b: i for i, b in enumerate(INFO.token_bytes) if b is not None}
    with pytest.raises(ValueError, match="EOS"):
        g.advance(s2, 0)
    t = g.advance(s, 0)
    assert g.is_terminated(t) and g.advance(t, 0) == t and not g.can_continue(t)
    with pytest.raises(ValueError, match="special"):
        g.advance(s, 1)
    assert hash(s) == hash(g.advance_bytes(g.initial_state, b"SELECT * FROM t"))  # states are values
    assert g.token_allowed(s, ids[b" "]) and not g.token_allowed(s, ids[b"!"])


def test_tokens_spanning_terminals():
    """A token like `",` closes a STRING terminal and continues into the next one."""
    g = COMPILER.compile_ebnf(JSON_G)
    ids = {b: i for i, b in enumerate(INFO.token_bytes) if b is not None}
    s = g.advance_bytes(g.initial_state, b'{"a": "x')
    assert g.token_allowed(s, ids[b'",']) and g.token_allowed(s, ids[b'"}'])
    s = g.advance(s, ids[b'"}'])
    assert g.is_final(s)
    s = g.advance_bytes(g.initial_state, b'{"a": 12')
    assert g.token_allowed(s, ids[b", "]) and g.token_allowed(s, ids[b"5"]) and not g.token_allowed(s, ids[b"a"])


@pytest.mark.parametrize(
    "grammar,match",
    [
        ("start: (", "invalid EBNF grammar"),
        ("start: foo", "invalid EBNF grammar"),
        ('start: A\nA: /a(?=b)/', "lookahead"),
        ('start: A\nA: /x*/', "zero-width"),
    ],
)
def test_bad_grammars(grammar, match):
    t0 = time.perf_counter()
    with pytest.raises(GrammarError, match=match):
        COMPILER.compile_ebnf(grammar)
    assert time.perf_counter() - t0 < 10.0  # fails fast, never hangs (bound generous for loaded CI)


@pytest.mark.parametrize("grammar", [
    "%import etc.passwd (X)\nstart: X",  # would open ./etc/passwd.lark
    "%import .etc.passwd (X)\nstart: X",  # relative to the grammar's (nonexistent) folder
    "%import grammars.common (NUMBER)\nstart: NUMBER",  # a lark package path, still a file name
])
def test_ebnf_imports_never_open_files(grammar, tmp_path, monkeypatch):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd.lark").write_text('X: "secret"\n')  # a decoy that compiles if ever read
    monkeypatch.chdir(tmp_path)
    from sglpy.grammar.ebnf.imports import bundled_grammars

    bundled_grammars()  # read at startup, before the audit below
    opened, recording = [], [True]

    def audit(event, args):
        if recording[0] and event == "open" and not str(args[0]).endswith((".py", ".pyc", ".so")):
            opened.append(args[0])

    import sys

    sys.addaudithook(audit)  # hooks cannot be removed: this one stops recording after the test
    try:
        with pytest.raises(GrammarError, match="refused"):
            GrammarCompiler(INFO).compile("ebnf", grammar)
    finally:
        recording[0] = False
    assert opened == []


def test_ebnf_bundled_imports_still_work():
    g = GrammarCompiler(INFO).compile("ebnf", "%import common (NUMBER, WS)\n%ignore WS\nstart: NUMBER")
    for seed in range(5):
        walk = random_walk(g, random.Random(seed), max_steps=30, eos_bias=0.3)
        if walk.finished:
            float(walk.data.decode().strip())  # a NUMBER, maybe with whitespace
