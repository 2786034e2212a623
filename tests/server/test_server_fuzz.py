"""Random request bodies never crash a route: every answer is 200 or a 4xx with an OpenAI error body.

Bodies mix every field name of each POST route's table (runtime/server/wire_tables.py) with random ones and
random JSON values of every type, lone surrogates included (fake engine).
"""

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglpy.runtime.server import wire_tables as t
from sglpy.runtime.testing.server_harness import FAKE, run_server

ROUTES = {"/generate": t.GENERATE, "/v1/completions": t.COMPLETIONS, "/v1/chat/completions": t.CHAT,
          "/tokenize": t.TOKENIZE, "/detokenize": t.DETOKENIZE, "/abort_request": t.ABORT,
          "/concate_and_append_request": t.CONCATE_AND_APPEND}
FIELDS = {route: [f.name for f in schema.fields] for route, schema in ROUTES.items()}
SP_NAMES = [f.name for f in t.SAMPLING.fields] + ["bogus"]

texts = st.one_of(st.text(max_size=8), st.text(st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010,
                                                             exclude_categories=()), max_size=3))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 40), st.floats(-3, 3, allow_nan=False), texts)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                      max_leaves=8)
sampling = st.dictionaries(st.sampled_from(SP_NAMES), scalars, max_size=4)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "bot"]),
                                           "content": st.one_of(st.text(max_size=10), values)}), max_size=3)


@st.composite
def bodies(draw):
    route = draw(st.sampled_from(sorted(FIELDS)))
    names = draw(st.lists(st.sampled_from(FIELDS[route] + ["unknown_x"]), max_size=6, unique=True))
    body = {}
    for name in names:
        if name == "sampling_params":
            body[name] = draw(sampling)
        elif name == "messages":
            body[name] = draw(messages)
        elif name in ("text", "prompt"):
            body[name] = draw(st.one_of(st.text(min_size=1, max_size=12), values))
        elif name in ("max_tokens",):
            body[name] = draw(st.one_of(st.integers(0, 8), values))
        else:
            body[name] = draw(values)
    if route.startswith("/v1/") and "max_tokens" not in body:
        body["max_tokens"] = 4  # chat's default is the whole context: too slow for a fuzz loop
    if route != "/abort_request" and "sampling_params" in body and isinstance(body["sampling_params"], dict):
        mnt = body["sampling_params"].get("max_new_tokens")
        if isinstance(mnt, int) and mnt > 8:
            body["sampling_params"]["max_new_tokens"] = 8  # keep generations short
    return route, body


@pytest.fixture(scope="module")
def srv():
    with run_server("--engine-factory", FAKE, env={"SGLPY_FAKE_TOKEN_DELAY": "0.0005"}) as s:
        yield s


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bodies())
def test_random_bodies_get_200_or_a_clean_4xx(srv, case):
    route, body = case
    r = requests.post(srv.url + route, json=body, timeout=30)
    assert r.status_code in (200, 400, 404, 413), (route, body, r.status_code, r.text)
    if r.status_code != 200:
        err = r.json()["error"]
        assert err["code"] == r.status_code and isinstance(err["message"], str) and err["message"]
    elif body.get("stream") is True and route != "/tokenize":
        assert r.text.rstrip().endswith("data: [DONE]")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(sorted(FIELDS)), st.binary(max_size=64), st.sampled_from(["application/json", "text/plain", ""]))
def test_raw_bytes_get_a_clean_400(srv, route, raw, ctype):
    r = requests.post(srv.url + route, data=raw, headers={"Content-Type": ctype} if ctype else {}, timeout=30)
    if r.status_code != 200:  # a few byte strings are valid JSON objects by chance
        assert r.status_code == 400 and r.json()["error"]["code"] == 400


@pytest.mark.parametrize("stream", [False, True])
def test_a_rid_with_control_characters_is_answered_with_an_encoded_header(srv, stream):
    """The rid is the client's (SGLang's field); a control character in it cannot go into a header verbatim."""
    r = requests.post(srv.url + "/generate", json={"text": "0", "rid": "a\x1fb\n", "stream": stream,
                                                   "sampling_params": {"max_new_tokens": 2}}, timeout=30)
    assert r.status_code == 200 and r.headers["X-Request-Id"] == "a%1Fb%0A"
    if not stream:
        assert r.json()["meta_info"]["id"] == "a\x1fb\n"  # the body keeps the rid as sent


def test_server_survives_the_fuzzing(srv):
    assert srv.get("/health").status_code == 200
    assert srv.post("/generate", {"text": "ok", "sampling_params": {"max_new_tokens": 2}}).status_code == 200
    assert "Traceback" not in srv.log() and "unhandled error" not in srv.log()
