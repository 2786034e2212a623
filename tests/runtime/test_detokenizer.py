"""Chunked detokenization (a request nobody reads until it ends) gives the text of per-token detokenization."""

import random

import pytest

from sglpy.runtime.engine.detokenizer import IncrementalDetokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


def _sequences(tok, n, rng):
    vocab = len(tok)
    text_ids = tok.encode("Grüße aus Köln — 東京 🙂🎉 naïve café, x = f(y); \"quotes\"\n\ttabs  ", add_special_tokens=False)
    special = list(tok.all_special_ids)
    for _ in range(n):
        kind = rng.random()
        if kind < 0.3:  # arbitrary ids: byte tokens that split characters, specials, anything
            yield [rng.randrange(vocab) for _ in range(rng.randrange(1, 40))]
        elif kind < 0.6:  # real text, cut anywhere, with specials mixed in
            ids = text_ids[rng.randrange(len(text_ids)):]
            yield [t if rng.random() > 0.1 else rng.choice(special) for t in ids]
        else:  # byte-level pieces of multi-byte characters
            yield [rng.choice(text_ids + list(range(128, 400))) for _ in range(rng.randrange(1, 30))]


@pytest.mark.parametrize("skip_special", [True, False])
def test_chunks_give_the_text_of_single_pushes(tokenizer, skip_special):
    rng = random.Random(0)
    prompt = tokenizer.encode("A prompt with context:")
    for ids in _sequences(tokenizer, 400, rng):
        one = IncrementalDetokenizer(tokenizer, prompt, skip_special)
        per_token = "".join(one.push([t]) for t in ids)
        chunked = IncrementalDetokenizer(tokenizer, prompt, skip_special)
        text, done = "", 0
        while done < len(ids):  # caught up in random chunks, as outputs are built
            done = min(len(ids), done + rng.randrange(1, 8))
            text += chunked.catch_up(ids[:done])
        assert text == per_token, ids
        assert text + chunked.flush() == per_token + one.flush(), ids


def test_catch_up_stops_at_an_unresolved_placeholder(tokenizer):
    ids = tokenizer.encode(" hello world", add_special_tokens=False)
    d = IncrementalDetokenizer(tokenizer, [1])
    assert d.catch_up(ids + [-1]) == IncrementalDetokenizer(tokenizer, [1]).push(ids)
    assert d.consumed == len(ids)


def test_backend_decode_gives_the_tokenizers_text(tokenizer):
    """The shortcut past transformers' decode wrapper is taken only where it is the same call."""
    from sglpy.runtime.engine.detokenizer import backend_decode

    fast = backend_decode(tokenizer)
    assert fast is not None  # the default tokenizer: a fast one without clean-up
    rng = random.Random(1)
    for ids in _sequences(tokenizer, 300, rng):
        for skip in (True, False):
            assert fast(ids, skip_special_tokens=skip) == tokenizer.decode(ids, skip_special_tokens=skip)

    class Cleaning(type(tokenizer)):
        def _decode(self, token_ids, **kwargs):  # a tokenizer that overrides a decode step: no shortcut
            return super()._decode(token_ids, **kwargs).upper()

    assert backend_decode(object()) is None
    tokenizer.clean_up_tokenization_spaces = True
    try:
        assert backend_decode(tokenizer) is None
    finally:
        tokenizer.clean_up_tokenization_spaces = False
    overriding = Cleaning.__new__(Cleaning)
    overriding.__dict__.update(tokenizer.__dict__)
    assert backend_decode(overriding) is None
    d = IncrementalDetokenizer(overriding, [1])
    assert d.push(tokenizer.encode(" hi", add_special_tokens=False)) == " HI"


def _decoding(tokenizer, prompt, skip):
    """A detokenizer that always decodes the window (the byte-level shortcut off): the oracle."""
    d = IncrementalDetokenizer(tokenizer, prompt, skip)
    d.concat = False
    return d


@pytest.mark.parametrize("skip_special", [True, False])
def test_byte_level_pushes_give_the_text_of_decoding_the_window(tokenizer, skip_special):
    """Per-token pushes without a decode call give the same deltas, token by token, as decoding the window:
    multi-byte characters split across tokens, specials (skipped or not), any ids; then the same flush."""
    rng = random.Random(2)
    prompt = tokenizer.encode("A prompt with context:")
    calls = []
    fast = IncrementalDetokenizer(tokenizer, prompt, skip_special)
    assert fast.concat  # the default tokenizer's decoder is byte-level: the shortcut is on
    for ids in _sequences(tokenizer, 400, rng):
        fast, slow = IncrementalDetokenizer(tokenizer, prompt, skip_special), _decoding(tokenizer, prompt, skip_special)
        call = fast._decode_call
        fast._decode_call = lambda ids, call=call: calls.append(len(ids)) or call(ids)
        for i, t in enumerate(ids):
            assert fast.catch_up(ids[:i + 1]) == slow.catch_up(ids[:i + 1]), ids[:i + 1]
            assert (fast.prefix_offset, fast.read_offset) == (slow.prefix_offset, slow.read_offset)
        assert fast.flush() == slow.flush(), ids
    assert calls  # the oracle's own decodes are not counted: the shortcut did decode where it had to
    text = tokenizer.encode(" plain words, one token each, in the steady state", add_special_tokens=False)
    fast = IncrementalDetokenizer(tokenizer, prompt, skip_special)
    call, calls = fast._decode_call, []
    fast._decode_call = lambda ids: calls.append(len(ids)) or call(ids)
    assert "".join(fast.push([t]) for t in text) == tokenizer.decode(text)
    assert max(calls[2:], default=1) == 1  # after the first push, no window is decoded (single texts are memoised)


def test_a_byte_level_window_decodes_to_its_tokens_texts_joined(tokenizer):
    """What the shortcut rests on: where every token alone decodes to valid text, the window's text is theirs joined."""
    rng = random.Random(3)
    vocab = len(tokenizer)
    ids = list(range(vocab)) if vocab <= 4096 else rng.sample(range(vocab), 4096)
    ids += list(tokenizer.all_special_ids)
    for skip in (True, False):
        single = {t: tokenizer.decode([t], skip_special_tokens=skip) for t in ids}
        clean = [t for t in ids if "\ufffd" not in single[t]]
        for _ in range(2000):
            window = [rng.choice(clean) for _ in range(rng.randrange(2, 6))]
            assert tokenizer.decode(window, skip_special_tokens=skip) == "".join(single[t] for t in window), window
