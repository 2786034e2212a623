"""A headless Chromium (system package) driven by Selenium, and an `sglpy serve` on the tiny model for it.

Where no browser can start (no chromium / chromedriver, no selenium, a sandbox that refuses it) every browser
test is skipped with the reason, which pytest's summary (-ra) prints under `make test`.
"""

import shutil

import pytest

from sglpy.runtime.testing.server_harness import run_server

KEY = "browser-test-key"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
DRIVERS = ("chromedriver",)
SETUP = "install them with `make venv` (apt-get install chromium chromium-driver; pip install selenium)"


def _find(names):
    return next((p for p in map(shutil.which, names) if p), None)


@pytest.fixture(scope="session")
def browser():
    """A headless Chromium WebDriver with the browser console log enabled; skips with the reason if none starts."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip(f"browser tests: selenium is not installed; {SETUP}")
    binary, driver_path = _find(BROWSERS), _find(DRIVERS)
    if binary is None or driver_path is None:
        pytest.skip(f"browser tests: no {'chromium' if binary is None else 'chromedriver'} on PATH; {SETUP}")
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--disable-extensions", "--no-first-run"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        driver = webdriver.Chrome(options=opts, service=Service(driver_path))
    except Exception as e:  # noqa: BLE001 - any start failure is a skip with its reason
        pytest.skip(f"browser tests: chromium did not start: {type(e).__name__}: {str(e).splitlines()[0]}")
    driver.set_script_timeout(20)
    yield driver
    driver.quit()


@pytest.fixture(scope="session")
def console_server(browser, tiny_model_path):
    """`sglpy serve` on the tiny model with an API key and tracing on."""
    with run_server("--model", tiny_model_path, "--max-total-tokens", "4096", "--max-context-len", "512",
                    "--num-threads", "1", "--enable-trace", api_key=KEY) as s:
        yield s
