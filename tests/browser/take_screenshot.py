"""The screenshot in docs/console.md: the playground after a JSON-schema generation on the default model.

    .venv/bin/python tests/browser/take_screenshot.py docs/img/console.png
"""

import shutil
import sys
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait

from sglpy.runtime.testing.server_harness import run_server


def main(path: str) -> int:
    """Start the server and the browser, generate once, save the screenshot to `path`."""
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or shutil.which("google-chrome")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1360,860",
                "--hide-scrollbars", "--force-device-scale-factor=1"):
        opts.add_argument(arg)
    with run_server("--enable-trace", startup_timeout=600) as srv:
        driver = webdriver.Chrome(options=opts, service=Service(shutil.which("chromedriver")))
        try:
            driver.get(srv.url + "/")
            wait = WebDriverWait(driver, 120, poll_frequency=0.1)
            wait.until(lambda d: d.find_element("id", "constraint-status").text.startswith("compiles"))
            driver.execute_script("document.getElementById('max-new-tokens').value = '60';")
            for _ in range(2):  # the second run finds its prompt in the radix cache (and a warm engine)
                driver.find_element("id", "generate").click()
                wait.until(lambda d: not d.find_element("id", "open-trace").get_property("disabled"))
            time.sleep(0.3)
            driver.save_screenshot(path)
            driver.find_element("id", "open-trace").click()
            wait.until(lambda d: d.execute_script("return !document.getElementById('trace-view').hidden"))
            time.sleep(0.3)
            driver.save_screenshot(path.replace(".png", "-trace.png"))
        finally:
            driver.quit()
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "console.png"))
