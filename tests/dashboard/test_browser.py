"""The dashboard in a real browser: headless Chromium (Debian's chromium and chromium-driver, driven
by selenium) against a real `fleetkeeper local` with a real service.

It proves what only a browser can: the page's script refreshes the table and the plots in place
under the strict Content-Security-Policy, the session cookie works and another origin's page can
neither read the dashboard nor act through it. `make test` installs Chromium where it can
(Makefile, `browser`); where it cannot, these tests are skipped with that reason and nothing else is.
With FLEETKEEPER_SCREENSHOTS=DIR (`make screenshots`) each page is also saved there as a PNG.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.support.local_process import FLEETKEEPER, LocalPlane, clean_env, eventually, ok, start_local

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# Chromium reaches for Google's services at start (sync, component updates, field trials): off, and a
# profile of its own, so that nothing but 127.0.0.1 is ever asked.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,1500",
)
SPEC = """\
service:
  readiness_probe: /
  replicas: 2
  ports: 8080
resources:
  instance_type: t3.micro
envs:
  GREETING: {greeting}
run: python3 -m http.server $PORT
"""
LOGIN = re.compile(r"(http://127\.0\.0\.1:\d+/login\?code=[A-Za-z0-9_-]+)")


def _missing() -> str | None:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        return (
            f"headless Chromium is not installed ({CHROMIUM}, {CHROMEDRIVER}: Debian's chromium and chromium-driver; "
            "`make test` installs them when it runs as root with apt-get): the dashboard's browser tests are skipped"
        )
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]'): the dashboard's browser tests are skipped"
    return None


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    reason = _missing()
    if reason is not None:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def screenshot(driver: Any, name: str) -> None:
    folder = os.environ.get("FLEETKEEPER_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(folder) / f"dashboard-{name}.png"))


def login_url(text: str) -> str:
    match = LOGIN.search(text)
    assert match, f"no login link in:\n{text}"
    return match[1]


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[LocalPlane]:
    if _missing() is not None:
        pytest.skip(_missing() or "")
    running = start_local(tmp_path, extra=["--allow-actions", "--metrics-interval", "2"])
    try:
        yield running
    finally:
        running.stop()


def spec(plane: LocalPlane, greeting: str) -> str:
    path = plane.workdir / f"web-{greeting}.yaml"
    path.write_text(SPEC.format(greeting=greeting))
    return str(path)


def text_of(driver: Any, css: str) -> str:
    from selenium.webdriver.common.by import By

    return " ".join(element.text for element in driver.find_elements(By.CSS_SELECTOR, css))


def series(driver: Any) -> dict[str, Any]:
    from selenium.webdriver.common.by import By

    shown: dict[str, Any] = json.loads(
        driver.find_element(By.CSS_SELECTOR, "svg.plot-replicas").get_attribute("data-series")
    )
    return shown


@contextlib.contextmanager
def another_origin(dashboard: str) -> Iterator[str]:
    """A page on another port of 127.0.0.1 (the same site, another origin) that tries to read the
    dashboard with the visitor's cookie, and a form that tries to roll a service back through it."""
    page = f"""<!doctype html><html><body><p id="read">reading</p>
<form id="attack" method="post" action="{dashboard}/services/web/rollback">
<input name="version" value="1"><input name="generation" value="1"><input name="confirmed" value="yes"></form>
<script>
fetch("{dashboard}/fragments/services", {{credentials: "include"}})
  .then(r => r.text()).then(t => {{ document.getElementById("read").textContent = "read: " + t.length; }})
  .catch(e => {{ document.getElementById("read").textContent = "refused: " + e.name; }});
</script></body></html>""".encode()

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_the_dashboard_in_a_browser_shows_a_rollout_and_acts_only_when_asked_by_its_own_page(
    plane: LocalPlane, browser: Any
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    ok(plane.cli("up", spec(plane, "one"), "-n", "web", "--wait", timeout=180))
    dashboard_link = login_url(plane.output())
    origin = dashboard_link.split("/login")[0]

    # Without the session: the login page's words, nothing of the services.
    browser.get(origin + "/")
    assert "not logged in" in browser.page_source and "web" not in text_of(browser, "table")

    # The one-time link logs in and lands on the services, refreshed in place by the page's script.
    browser.get(dashboard_link)
    assert browser.current_url == origin + "/"
    # `up --wait` returns once the service is READY, which one ready replica of two already makes it.
    eventually(
        lambda: "READY" in (row := text_of(browser, 'tr[data-name="web"]')) and "2 / 2" in row,
        60,
        what="web READY in the table with both replicas",
    )
    eventually(lambda: "refreshed" in text_of(browser, "#refreshed"), 30, what="the script refreshing the table")
    screenshot(browser, "services")

    # The service page: its replicas, then a rolling update seen on the replicas-by-status plot.
    browser.get(origin + "/services/web")
    eventually(lambda: len(browser.find_elements(By.CSS_SELECTOR, "tr.replica")) == 2, 60, what="two replicas")
    ok(plane.cli("update", "web", spec(plane, "two")))

    def rolled_out() -> bool:
        shown = series(browser)
        versions = [sample["by_version"] for sample in shown["samples"]]
        both = any("1" in v and "2" in v for v in versions)  # old and new replicas at once: the rollout
        done = bool(versions) and versions[-1] == {"2": 2} and shown["samples"][-1]["by_status"] == {"READY": 2}
        return both and done and any(m["reason"] == "Updated" for m in shown["marks"])

    eventually(rolled_out, 180, interval=1.0, what="the rollout on the replicas-by-status plot")
    statuses = {s for sample in series(browser)["samples"] for s in sample["by_status"]}
    assert "READY" in statuses and len(statuses) > 1, statuses  # replicas starting beside the ready ones
    screenshot(browser, "service")

    # An action: roll back to v1, confirmed on a page of its own, sent with this page's token (the
    # page loaded now: its forms are as of its load, v2 included).
    browser.get(origin + "/services/web")
    Select(browser.find_element(By.CSS_SELECTOR, "#rollback-form select")).select_by_value("1")
    browser.find_element(By.CSS_SELECTOR, "#rollback-form button").click()
    # click() may return before the confirmation page has loaded (seen in a clean-clone run: the
    # source read was still the service page's): wait for it, as for the notice below.
    eventually(lambda: "Roll web back from v2 to v1?" in browser.page_source, 30, what="the confirmation page")
    assert plane.service("web")["target_version"] == 2  # nothing sent before the confirmation
    screenshot(browser, "confirm")
    browser.find_element(By.ID, "confirm").click()
    eventually(lambda: "rolled back to v1" in browser.page_source, 30, what="the rollback's notice")
    assert plane.service("web")["target_version"] == 1

    # Another origin's page, with the same cookie in the same browser: it cannot read the dashboard
    # (no CORS), and its form is refused (its Origin is not the dashboard's; it has no CSRF token).
    with another_origin(origin) as attacker:
        browser.get(attacker)
        eventually(lambda: browser.find_element(By.ID, "read").text.startswith("refused"), 30, what="the read refused")
        browser.find_element(By.ID, "attack").submit()
        eventually(lambda: "own pages only" in browser.page_source, 30, what="the action refused")
    assert plane.service("web")["target_version"] == 1  # as the rollback left it

    # A DNS-rebinding name (any Host but 127.0.0.1:<port>) is refused before anything is read.
    port = origin.rsplit(":", 1)[1]
    browser.get(f"http://localhost:{port}/")
    assert "Host header" in browser.page_source and "web" not in text_of(browser, "body").replace("Host", "")


def test_a_dashboard_without_allow_actions_refuses_every_action(plane: LocalPlane, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    ok(plane.cli("up", spec(plane, "one"), "-n", "web"))
    ok(plane.cli("update", "web", spec(plane, "two")))
    process = subprocess.Popen(
        [sys.executable, "-c", FLEETKEEPER, "dashboard", "--api-url", plane.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**clean_env(), **plane.env, "PYTHONUNBUFFERED": "1"},
        cwd=plane.workdir,
    )
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline() for _ in range(2)]
        assert "read-only" in lines[0], lines
        link = login_url("".join(lines))
        origin = link.split("/login")[0]
        browser.get(link)
        browser.get(origin + "/services/web")
        eventually(lambda: "read-only" in text_of(browser, "section.actions"), 30, what="the read-only note")
        assert not browser.find_elements(By.ID, "rollback-form")
        # A form posted from the dashboard's own page, as a page could: refused all the same.
        browser.execute_script(
            "const f = document.createElement('form'); f.method = 'post'; f.action = '/services/web/rollback';"
            "for (const [k, v] of [['version', '1'], ['generation', '2'], ['confirmed', 'yes'], ['csrf', 'x']]) {"
            "const i = document.createElement('input'); i.name = k; i.value = v; f.appendChild(i); }"
            "document.body.appendChild(f); f.submit();"
        )
        eventually(lambda: "read-only" in browser.title or "read-only" in browser.page_source, 30, what="refused")
        assert "start it with --allow-actions" in browser.page_source
        assert plane.service("web")["target_version"] == 2
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
