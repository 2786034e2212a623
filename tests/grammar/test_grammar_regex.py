"""Regex -> byte DFA -> token guide: property walks, brute-force masks, API semantics, bad input."""

import random
import re
import threading
import time

import interegular
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglpy.grammar import DTYPE_REGEX, GrammarCompiler, GrammarError, TokenizerInfo
from sglpy.grammar.regex import regex_to_dfa
from sglpy.grammar.json.schema import schema_to_regex
from sglpy.grammar.testing import mask_to_ids, random_walk, small_vocab_info

INFO = small_vocab_info()
COMPILER = GrammarCompiler(INFO)

CORPUS = [
    r"[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,4}",  # email
    r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",  # date (unicode \d)
    r"((25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)\.){3}(25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)",  # IPv4
    r"(cat|dog|bird)s?( and (cat|dog|bird)s?){0,2}",  # alternations, bounded repeat
    r"a{2,5}b{0,3}c?",
    r"[😀-🙏]{1,3}x?",  # 4-byte characters
    r"\w{1,8}( \w{1,8}){0,2}",  # unicode word class
    r"[^\x00-\x7f]{1,4}",  # non-ASCII only
    r'\{"name": "[a-z ]{1,10}", "age": (0|[1-9][0-9]{0,2})\}',  # JSON-like
    r"[-+]?[0-9]+[ ]*",
    r"(?s:.){0,3}z",
    DTYPE_REGEX["float"],
    DTYPE_REGEX["str"],
    schema_to_regex({"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99},
                                                      "tag": {"enum": ["a", "b c"]}}, "required": ["id"]}),
]


def _decode(data: bytes) -> str:
    return data.decode("utf-8")


@pytest.mark.parametrize("pattern", CORPUS)
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_walks_fullmatch(pattern, seed):
    guide = COMPILER.compile_regex(pattern)
    walk = random_walk(guide, random.Random(seed), max_steps=120, eos_bias=0.3)
    if walk.finished:
        assert re.fullmatch(pattern, _decode(walk.data)), (pattern, walk.data)
    for s in walk.states[:-1]:
        assert not guide.is_terminated(s)


def _interegular_live(fsm, text: str) -> bool:
    """Independent oracle: walk interegular's char-level FSM; alive = some completion exists."""
    state = fsm.initial
    for ch in text:
        sym = fsm.alphabet[ch] if ch in fsm.alphabet else fsm.alphabet[interegular.fsm.anything_else]
        nxt = fsm.map.get(state, {}).get(sym)
        if nxt is None:
            return False
        state = nxt
    return fsm.islive(state)


BRUTE = [
    r"[a-c]{1,3}(x|yz)?",
    r"(ab|abc|b)+\.com",
    r"(true|false|null)",
    r'\{"id": [0-9]{1,3}\}',
    r"(é|ü)+[a-z]?",
]


@pytest.mark.parametrize("pattern", BRUTE)
def test_mask_matches_brute_force(pattern):
    """Token allowed <=> prefix + token bytes is a viable prefix (checked with interegular + re)."""
    guide = COMPILER.compile_regex(pattern)
    fsm = interegular.parse_pattern(pattern).to_fsm()
    rng = random.Random(0)
    checked = 0
    for _ in range(6):
        walk = random_walk(guide, rng, max_steps=12, eos_bias=0.2)
        prefix = b""
        for state, tok in zip(walk.states, walk.tokens + [None]):
            allowed = set(mask_to_ids(guide.allowed(state), INFO.vocab_size).tolist())
            try:
                prefix.decode("utf-8")
            except UnicodeDecodeError:
                allowed = None  # mid-character state: the char-level oracle cannot express it
            for t, tb in enumerate(INFO.token_bytes if allowed is not None else ()):
                if t in INFO.eos_token_ids:
                    expect = bool(re.fullmatch(pattern, prefix.decode()))
                elif tb is None:
                    expect = False
                else:
                    try:
                        text = (prefix + tb).decode("utf-8")
                    except UnicodeDecodeError:
                        continue  # partial characters: covered by the walk tests
                    expect = _interegular_live(fsm, text)
                assert (t in allowed) == expect, (pattern, prefix, tb)
                checked += 1
            if tok is None or tok in INFO.eos_token_ids:
                break
            prefix += INFO.token_bytes[tok]
    assert checked > 1000


def test_multibyte_split_tokens():
    guide = COMPILER.compile_regex("😀+")
    ids = {b: i for i, b in enumerate(INFO.token_bytes) if b is not None}
    s = guide.advance(guide.initial_state, ids[b"\xf0\x9f"])
    assert not guide.is_final(s)
    s = guide.advance(s, ids[b"\x98\x80"])
    assert guide.is_final(s)
    s = guide.advance(s, ids["😀".encode()])
    assert guide.token_allowed(s, 0)
    with pytest.raises(ValueError):
        guide.advance(s, ids[b"\xa9"])


def test_api_semantics():
    guide = COMPILER.compile_regex(r"ab(c|d)")
    ids = {b: i for i, b in enumerate(INFO.token_bytes) if b is not None}
    s0 = guide.initial_state
    assert guide.forced_string(s0) == "ab" and guide.forced_bytes(s0) == b"ab"
    assert not guide.is_final(s0) and guide.can_continue(s0)
    with pytest.raises(ValueError, match="not allowed"):
        guide.advance(s0, ids[b"b"])
    with pytest.raises(ValueError, match="EOS"):
        guide.advance(s0, 0)
    with pytest.raises(ValueError, match="special"):
        guide.advance(s0, 1)
    with pytest.raises(ValueError, match="outside"):
        guide.advance(s0, 10**6)
    s = guide.advance(guide.advance_bytes(s0, b"ab"), ids[b"c"])
    assert guide.is_final(s) and not guide.can_continue(s) and guide.forced_string(s) == ""
    allowed = mask_to_ids(guide.allowed(s), INFO.vocab_size).tolist()
    assert allowed == [0]
    t = guide.advance(s, 0)
    assert guide.is_terminated(t) and guide.is_final(t) and guide.advance(t, 0) == t  # EOS idempotent
    with pytest.raises(ValueError, match="after EOS"):
        guide.advance(t, ids[b"c"])
    row = np.zeros(INFO.mask_words, np.int32)
    guide.fill_bitmask(s0, row)
    assert (row == guide.allowed(s0)).all() and row.dtype == np.int32
    assert guide.allowed(s0).shape == ((INFO.vocab_size + 31) // 32,)
    # padding ids and special tokens are never allowed
    pad = INFO.vocab_size - 1
    for st_ in (s0, guide.advance_bytes(s0, b"a")):
        bits = set(mask_to_ids(guide.allowed(st_), INFO.vocab_size).tolist())
        assert pad not in bits and 1 not in bits
    with pytest.raises(ValueError, match="invalid guide state"):
        guide.allowed(10**6)


def test_accepting_state_with_continuations_is_not_forced():
    """Final states are branching points: `[-+]?[0-9]+[ ]*` never forces the trailing spaces."""
    guide = COMPILER.compile_regex(r"[-+]?[0-9]+[ ]*")
    s = guide.advance_bytes(guide.initial_state, b"12 ")
    assert guide.is_final(s) and guide.can_continue(s) and guide.forced_string(s) == ""
    g2 = COMPILER.compile_regex(r"x(é|ë)")
    s = g2.advance_bytes(g2.initial_state, b"x")
    assert g2.forced_bytes(s) == b"\xc3" and g2.forced_string(s) == ""  # never cut a character


def test_cache_and_threads():
    comp = GrammarCompiler(INFO, cache_size=4)
    pat = r"(cat|dog)[0-9]{1,20}"
    results = []
    threads = [threading.Thread(target=lambda: results.append(comp.compile_regex(pat))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r is results[0] for r in results)
    assert comp.compile("regex", pat) is results[0]  # cached: the same guide object
    for i in range(6):
        comp.compile_regex(f"x{i}")
    assert comp.compile_regex(pat) is not results[0]  # evicted (LRU of 4)


def test_choices_and_dtypes():
    g = COMPILER.compile_choices(["yes", "no", "a.b"])
    for w in ("yes", "no", "a.b"):
        assert g.is_final(g.advance_bytes(g.initial_state, w.encode()))
    with pytest.raises(ValueError):
        g.advance_bytes(g.initial_state, b"aXb")
    for name, ok in (("int", "-12\n"), ("float", "3.5"), ("bool", "True"), ("str", '"hi there 2"')):
        g = COMPILER.compile("dtype", name)
        assert g.is_final(g.advance_bytes(g.initial_state, ok.encode()))
    assert COMPILER.compile_dtype(int) is COMPILER.compile("dtype", "int")
    with pytest.raises(GrammarError, match="dtype"):
        COMPILER.compile_dtype(list)
    with pytest.raises(GrammarError, match="choices"):
        COMPILER.compile_choices([])


@pytest.mark.parametrize(
    "pattern,match",
    [
        ("a(b", "invalid regex"),
        (r"(a)\1", "backreference"),
        (r"(a(?=b))*", "lookahead inside a repeat"),
        (r"(?<!a)b", "lookbehind"),
        (r"a(?!b$)c", "inside a lookahead"),
        (r"\bword\b", "word boundary"),
        (r"a^b", "anchor"),
        (r"(?i)abc", "IGNORECASE"),
        (r"[^\x00-\U0010ffff]", "matches no string"),
        (r"\p{NoSuchProperty}", "unknown Unicode property"),
        (r"\p{L", "unterminated"),
    ],
)
def test_bad_regex(pattern, match):
    t0 = time.perf_counter()
    with pytest.raises(GrammarError, match=match):
        COMPILER.compile_regex(pattern)
    assert time.perf_counter() - t0 < 10.0  # fails fast, never hangs (bound generous for loaded CI)


PROPERTY_PATTERNS = [r"^\p{Lu}[\p{Nd}_]+\\p{L}", r"[^\P{ASCII}]+", r"\p{Letter}+", r"[]\p{Greek}]+",
                     r"\p{sc=Cyrl}\d", r"[\P{L}]{2}", r"\p{gc=Nd}|\p{White_Space}"]


@pytest.mark.parametrize("pattern", PROPERTY_PATTERNS)
@settings(max_examples=40, deadline=None)
@given(texts=st.lists(st.text(alphabet="Ab_1٣ά]Ж\\p{L} é", max_size=6), min_size=5, max_size=20))
def test_unicode_property_escapes_match_the_regex_package(pattern, texts):
    """\\p{..} / \\P{..} (ECMA-262 u-mode, which JSON Schema patterns use) are exact code-point classes."""
    import regex

    dfa = regex_to_dfa(pattern, 20_000)
    for t in texts + ["A1_\\p{L}", "Ж1", "ά]", "é"]:
        assert dfa.fullmatch(t.encode()) == bool(regex.fullmatch(pattern, t)), (pattern, t)


LOOKAHEAD_PATTERNS = [r"^(https?://|/?.?-?(?!\w+://)\w).+\.ya?ml$", r"a(?!b)\w", r"(?=\d{2})\d+", r"x(?!ab|c)[a-c]*$",
                      r"^(?!foo)\w+$", r"(a(?=b)|c)b", r"^(?!.*--)[a-z-]+$", r"a(?=b)"]


@pytest.mark.parametrize("pattern", LOOKAHEAD_PATTERNS)
@settings(max_examples=25, deadline=None)
@given(texts=st.lists(st.text(alphabet="abcfo1-:/.yml\n", max_size=9), min_size=10, max_size=30))
def test_lookaheads_match_python_re(pattern, texts):
    """Lookaheads are exact: fullmatch, and re.search with Python's `$` (a final newline allowed)."""
    full = regex_to_dfa(pattern, 20_000, allow_empty=True)
    search = regex_to_dfa(pattern, 20_000, allow_empty=True, search=True, dollar_newline=True)
    for t in texts + ["http://a.yml", "ab", "a1", "foo1"]:
        assert full.fullmatch(t.encode()) == bool(re.fullmatch(pattern, t)), (pattern, t)
        assert search.fullmatch(t.encode()) == bool(re.search(pattern, t)), (pattern, t)


WORDS = [f"{a}{b}{c}-az{d}" for a in "aeu" for b in "pns" for c in "ew" for d in "1234"]  # 72 literals


@settings(max_examples=20, deadline=None)
@given(texts=st.lists(st.text(alphabet="aepnsuwz-1234x", max_size=12), min_size=10, max_size=30),
       anchor=st.sampled_from(["", "^", "$", "^$"]))
def test_search_of_many_alternatives_is_small_and_exact(texts, anchor):
    """An unanchored alternation of literals pads once outside the group: one padding per alternative made the
    subset construction track which alternatives had matched (2^n subsets); anchors inside still delegate."""
    body = "(" + "|".join(WORDS) + ")"
    pattern = (anchor[:1] if anchor.startswith("^") else "") + body + ("$" if anchor.endswith("$") else "")
    t0 = time.process_time()
    dfa = regex_to_dfa(pattern, 2_000, allow_empty=True, search=True)
    assert dfa.num_states < 1_000 and time.process_time() - t0 < 5.0
    mixed = regex_to_dfa("(^ae|" + "|".join(WORDS[1:]) + ")", 2_000, allow_empty=True, search=True)
    for t in texts + WORDS[:3] + ["xx" + WORDS[5] + "x", WORDS[0] + "x"]:
        assert dfa.fullmatch(t.encode()) == bool(re.search(pattern, t)), (pattern, t)
        assert mixed.fullmatch(t.encode()) == bool(re.search("(^ae|" + "|".join(WORDS[1:]) + ")", t)), t


def test_state_blowup_is_a_clear_fast_error():
    comp = GrammarCompiler(INFO, max_states=500)
    t0 = time.perf_counter()
    with pytest.raises(GrammarError, match="more than 500 DFA states"):
        comp.compile_regex(r"(a|b)*a(a|b){14}")
    with pytest.raises(GrammarError, match="too large"):
        comp.compile_regex(r"(((a{100}){100}){100}){100}")
    assert time.perf_counter() - t0 < 10.0  # fails fast, never hangs (bound generous for loaded CI)
    assert isinstance(GrammarError("x"), ValueError)


def test_incompatible_vocabulary_and_bad_info():
    info = TokenizerInfo((None, b"a", b"b"), eos_token_ids=(0,))
    comp = GrammarCompiler(info)
    with pytest.raises(GrammarError, match="incompatible vocabulary"):
        comp.compile_regex("ac")
    with pytest.raises(ValueError, match="EOS"):
        TokenizerInfo((b"a",), eos_token_ids=())
    with pytest.raises(ValueError, match="bytes or None"):
        TokenizerInfo(("a",), eos_token_ids=(0,))


def test_dfa_is_minimal_for_simple_cases():
    assert regex_to_dfa("(a|b)*").num_states == 2  # dead + one state
    assert regex_to_dfa("abc|abd").num_states == 5
    d = regex_to_dfa(r"^x+$")
    assert d.fullmatch(b"xxx") and not d.fullmatch(b"")


def test_disk_cache_round_trip(tmp_path):
    pat = r"(cat|dog)s?[0-9]{1,3}"
    first = GrammarCompiler(INFO, cache_dir=str(tmp_path)).compile_regex(pat)
    files = list(tmp_path.glob("regex-*.npz"))
    assert len(files) == 1
    again = GrammarCompiler(INFO, cache_dir=str(tmp_path)).compile_regex(pat)
    assert again is not first and again.num_states == first.num_states
    for s in range(1, first.num_states):
        assert (again.allowed(s) == first.allowed(s)).all()
    assert again.forced_string(again.initial_state) == first.forced_string(first.initial_state)
    files[0].write_bytes(b"garbage")  # a corrupt entry is rebuilt, not an error
    rebuilt = GrammarCompiler(INFO, cache_dir=str(tmp_path)).compile_regex(pat)
    assert (rebuilt.allowed(rebuilt.initial_state) == first.allowed(first.initial_state)).all()
    other = small_vocab_info(extra=[b"zzz"])
    with pytest.raises(ValueError, match="another tokenizer"):
        type(first).load(_resave(first, tmp_path), other)


def _resave(guide, tmp_path):
    path = str(tmp_path / "g.npz")
    guide.save(path)
    return path


_ATOMS = st.sampled_from(["a", "b", "c", "[ab]", "[^a]", ".", "é", "\\d", "(?:)"])


def _regexes():
    def extend(inner):
        return st.one_of(
            st.tuples(inner, inner).map(lambda t: t[0] + t[1]),
            st.tuples(inner, inner).map(lambda t: f"(?:{t[0]}|{t[1]})"),
            st.tuples(inner, st.sampled_from(["*", "+", "?", "{2}", "{0,2}", "{1,3}", "*?"])).map(
                lambda t: f"(?:{t[0]}){t[1]}"),
        )

    return st.recursive(_ATOMS, extend, max_leaves=8)


@settings(max_examples=120, deadline=None)
@given(pattern=_regexes(), texts=st.lists(st.text(alphabet="abcé1٣\n", max_size=7), min_size=10, max_size=30))
def test_dfa_agrees_with_python_re(pattern, texts):
    """Random regexes: the byte DFA accepts exactly what re.fullmatch accepts.

    Default classes are ASCII (re.ASCII semantics); unicode_classes=True gives Python's default.
    """
    dfa = regex_to_dfa(pattern)
    udfa = regex_to_dfa(pattern, unicode_classes=True)
    for t in texts:
        assert dfa.fullmatch(t.encode()) == bool(re.fullmatch(pattern, t, re.ASCII)), (pattern, t)
        assert udfa.fullmatch(t.encode()) == bool(re.fullmatch(pattern, t)), (pattern, t)


@pytest.mark.parametrize("pattern", [r'"(?:[^"\\]|\\n){0,30}"', r"[a-c]{2,40}x", r"(é|ab){1,12}"])
def test_index_matches_dfa_walk_in_every_state(pattern):
    """Masks shared between look-alike states equal a direct walk of every token from every state."""
    guide = COMPILER.compile_regex(pattern)
    dfa = guide.dfa
    for s in range(1, dfa.num_states):
        bits = set(mask_to_ids(guide.allowed(s), INFO.vocab_size).tolist())
        expect = {t for t, b in enumerate(INFO.token_bytes) if b and dfa.walk(s, b) != 0}
        if dfa.accepting[s]:
            expect.add(0)
        assert bits == expect, (pattern, s)


def test_minimisation_survives_hash_collisions(monkeypatch):
    from sglpy.grammar.regex import dfa as dfa_mod

    def collide(block, ctrans):
        return np.zeros(len(block), np.int64), 1  # every row "equal": must be caught and redone exactly

    monkeypatch.setattr(dfa_mod, "_hash_group", collide)
    d = regex_to_dfa(r"(ab|abc|b)+\.com")
    for text, ok in ((b"ab.com", True), (b"abcb.com", True), (b"a.com", False), (b"b.co", False)):
        assert d.fullmatch(text) == ok
    assert d.num_states == 9


def test_minimisation_budget_keeps_the_language(monkeypatch):
    """Past the refinement budget the trimmed automaton is used unminimised: same language."""
    from sglpy.grammar.regex import dfa as dfa_mod

    monkeypatch.setattr(dfa_mod, "_MINIMISE_WORK", 1)
    d = regex_to_dfa(r"(?:ab|ac){0,70}d")
    assert d.fullmatch(b"ab" * 70 + b"d") and d.fullmatch(b"acd") and not d.fullmatch(b"ab" * 71 + b"d")
    assert not d.fullmatch(b"abc")
