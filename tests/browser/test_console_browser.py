"""The web console in a real browser (headless Chromium): page load, key, playground stream, errors, dashboard, traces."""

import json
import threading

import pytest
import requests

KEY = "browser-test-key"  # the server fixture's key (conftest.py)

SEVERE = "SEVERE"


def wait_for(browser, predicate, timeout=60.0, what="condition"):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, timeout, poll_frequency=0.05).until(lambda d: predicate(d), message=what)


def by_id(browser, id_):
    from selenium.webdriver.common.by import By

    return browser.find_element(By.ID, id_)


def open_console(browser, srv, with_key=True):
    """Load the page (with the key in sessionStorage when asked); return the console log of that load."""
    browser.get(srv.url + "/")
    browser.execute_script("sessionStorage.clear(); localStorage.clear();")
    if with_key:
        browser.execute_script("sessionStorage.setItem('sglpy-api-key', arguments[0]);", KEY)
    browser.get_log("browser")  # drop what the first load logged
    browser.refresh()
    wait_for(browser, lambda d: d.execute_script("return document.readyState") == "complete", what="page load")
    return browser


def set_value(browser, id_, value):
    """Set a field's value as typing would (an input event follows)."""
    browser.execute_script("const e = document.getElementById(arguments[0]); e.value = arguments[1];"
                           "e.dispatchEvent(new Event('input', {bubbles: true}));", id_, value)


def select(browser, id_, value):
    browser.execute_script("const e = document.getElementById(arguments[0]); e.value = arguments[1];"
                           "e.dispatchEvent(new Event('change', {bubbles: true}));", id_, value)


def origins(browser, container):
    return browser.execute_script(
        "return Array.from(document.querySelectorAll('#' + arguments[0] + ' .tok')).map(s => s.dataset.origin);",
        container)


def generate(browser, max_new_tokens=24):
    set_value(browser, "max-new-tokens", str(max_new_tokens))
    # count the renders of the output while it streams (a MutationObserver set up before the click)
    browser.execute_script("window.__renders = 0; new MutationObserver(() => window.__renders++)"
                           ".observe(document.getElementById('output'), {childList: true});")
    by_id(browser, "generate").click()
    wait_for(browser, lambda d: by_id(d, "output").get_attribute("data-state") == "done"
             and not by_id(d, "open-trace").get_property("disabled"), what="generation to finish")


def test_page_loads_without_console_errors(browser, console_server):
    open_console(browser, console_server)
    wait_for(browser, lambda d: by_id(d, "constraint-status").text.startswith("compiles"), what="compile check")
    assert by_id(browser, "key-panel").get_attribute("hidden") is not None  # the stored key was accepted
    errors = [e for e in browser.get_log("browser") if e["level"] == SEVERE]
    assert errors == []


def test_key_is_asked_once_and_never_put_in_a_url(browser, console_server):
    open_console(browser, console_server, with_key=False)
    wait_for(browser, lambda d: d.execute_script("return !document.getElementById('key-panel').hidden"),
             what="the key form")
    by_id(browser, "key-input").send_keys(KEY)
    by_id(browser, "key-form").submit()
    wait_for(browser, lambda d: by_id(d, "constraint-status").text.startswith("compiles"), what="compile check")
    assert KEY not in browser.current_url
    assert browser.execute_script("return sessionStorage.getItem('sglpy-api-key')") == KEY
    assert browser.execute_script("return localStorage.getItem('sglpy-api-key')") is None


def test_constrained_generation_streams_with_origins(browser, console_server):
    open_console(browser, console_server)
    select(browser, "constraint-kind", "json_schema")
    generate(browser, 40)
    seen = origins(browser, "output")
    assert seen[0] == "jump_forward" and "sampled" in seen  # '{"' is forced by the schema, values are sampled
    assert browser.execute_script("return window.__renders") >= 3  # it streamed, not one final paint
    text = by_id(browser, "output").text
    assert text.startswith('{"name')
    assert "jump-forward" in by_id(browser, "gen-status").text


def test_bad_schema_shows_the_server_error(browser, console_server):
    open_console(browser, console_server)
    select(browser, "constraint-kind", "json_schema")
    set_value(browser, "constraint", json.dumps({"type": "objec"}))
    wait_for(browser, lambda d: "objec" in by_id(d, "constraint-status").text, what="the compiler's error")
    assert "error" in by_id(browser, "constraint-status").get_attribute("class")
    by_id(browser, "generate").click()
    wait_for(browser, lambda d: "objec" in by_id(d, "gen-error").text, what="the generate error")


def card(browser, name) -> float:
    """A dashboard card's number, read by script (the cards are rebuilt every second: no stale element)."""
    text = browser.execute_script("const e = document.getElementById('card-' + arguments[0]);"
                                  "return e ? e.textContent : null;", name)
    return float(text) if text not in (None, "") else -1.0


def test_dashboard_updates_under_load(browser, console_server):
    open_console(browser, console_server)
    by_id(browser, "tab-dashboard").click()
    wait_for(browser, lambda d: card(d, "generated") >= 0, what="dashboard cards")
    before = card(browser, "generated")
    stop = threading.Event()

    def load():
        while not stop.is_set():
            requests.post(console_server.url + "/generate", headers=console_server.headers, timeout=30,
                          json={"text": "load", "sampling_params": {"max_new_tokens": 16, "ignore_eos": True}})

    threads = [threading.Thread(target=load, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        wait_for(browser, lambda d: card(d, "generated") >= before + 32, timeout=60, what="generated tokens")
        wait_for(browser, lambda d: card(d, "tps") > 0, timeout=60, what="tokens/s")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert "updated" in by_id(browser, "dash-status").text


def test_trace_opens(browser, console_server):
    open_console(browser, console_server)
    select(browser, "constraint-kind", "regex")
    set_value(browser, "constraint", "(yes|no), because [a-z ]{1,20}\\.")
    generate(browser, 30)
    by_id(browser, "tab-traces").click()
    wait_for(browser, lambda d: d.find_elements("css selector", "#trace-table button.link"), what="trace list")
    browser.find_elements("css selector", "#trace-table button.link")[0].click()  # the newest: this request
    wait_for(browser, lambda d: d.execute_script("return !document.getElementById('trace-view').hidden"),
             what="trace view")
    wait_for(browser, lambda d: origins(d, "trace-output"), what="trace tokens")
    phases = browser.execute_script("return Array.from(document.querySelectorAll('#trace-phases td:first-child'))"
                                    ".map(td => td.textContent);")
    assert phases[0] == "compile wait" and "prefill" in phases and phases[-1] == "finish"
    assert browser.find_elements("css selector", "#trace-timeline .bar")
    assert set(origins(browser, "trace-prompt")) <= {"cached", "prefilled"}
    assert "regex" in by_id(browser, "trace-summary").text


def test_html_in_a_prompt_is_shown_as_text(browser, console_server):
    open_console(browser, console_server)
    hostile = '<img src=x onerror="window.__pwned=1"><b>bold</b><script>window.__pwned=2</script>'
    by_id(browser, "mode-raw").click()
    select(browser, "constraint-kind", "")
    set_value(browser, "prompt", hostile)
    generate(browser, 4)
    by_id(browser, "open-trace").click()
    wait_for(browser, lambda d: origins(d, "trace-prompt"), what="trace prompt")
    prompt_box = by_id(browser, "trace-prompt")
    assert prompt_box.get_property("textContent") == hostile  # every character, as text
    assert browser.execute_script("return document.querySelectorAll('#trace-prompt img, #trace-prompt b, "
                                  "#trace-prompt script, #output img').length") == 0
    assert browser.execute_script("return window.__pwned === undefined")
    assert [e for e in browser.get_log("browser") if e["level"] == SEVERE] == []


@pytest.fixture(autouse=True)
def _fresh_tab(browser):
    yield
    browser.execute_script("window.__pwned = undefined;")
