"""The dashboard in a real headless Chromium (Debian's ``chromium`` + ``chromium-driver``, driven by
Selenium), against a real `bait serve` (and, in the PostgreSQL + Redis pass, a separate `bait worker`).

The flow: sign in with an API key, open a pool, request a batch and watch the batches table go from
queued/running to succeeded without a reload, see the learning curve gain a point, open the batch page,
label two items by hand, request the next batch and see the curve gain another point; another tenant's
pool id answers 404; /docs and /redoc render. Every request any page made (Chrome's DevTools network log)
went to the service's own origin.

Chromium is required: CI installs it (``.ci/run``). Where it is absent the test is skipped, unless
``BAIT_REQUIRE_BROWSER=1`` (set by CI), where its absence is a failure. Screenshots of every page go to
``$BAIT_SCREENSHOTS`` when set (``docs/screenshots`` to refresh the README's), else to the test's tmp dir.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest

from tests.conftest import REDIS_URL, SHARED_DATA
from tests.e2e.procs import ROOT, Proc, bait, bait_env, serve, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.browser]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
DIGITS = [str(d) for d in range(10)]
DEPLOYMENTS = ["embedded", "workers"] if REDIS_URL else ["embedded"]

if not (Path(CHROMIUM).is_file() and Path(CHROMEDRIVER).is_file()):
    if os.environ.get("BAIT_REQUIRE_BROWSER") == "1":
        raise RuntimeError(f"{CHROMIUM} / {CHROMEDRIVER} missing: apt-get install -y chromium chromium-driver")
    pytest.skip("no Debian chromium + chromium-driver here (CI installs them)", allow_module_level=True)

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import (  # noqa: E402
    NoSuchElementException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402


@pytest.fixture(params=DEPLOYMENTS)
def deployment(
    request: pytest.FixtureRequest, tmp_path: Path, database_url: str, db: Any
) -> Iterator[tuple[str, dict[str, str]]]:
    procs: list[Proc] = []
    if request.param == "workers":
        env = bait_env(database_url, REDIS_URL, f"bait-ui-{uuid.uuid4().hex[:8]}")
        procs.append(Proc(["worker", "--name", f"ui-{uuid.uuid4().hex[:6]}"], env, tmp_path / "worker.log"))
        server, base = serve(env, tmp_path / "serve.log")
    else:
        env = bait_env(f"sqlite:///{tmp_path / 'data' / 'bait.db'}", None, "bait")
        server, base = serve(env, tmp_path / "serve.log", migrate=True)
    procs.append(server)
    try:
        yield base, env
    finally:
        for p in procs:
            p.stop()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    opts = Options()
    opts.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1400,1100",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    # An explicit driver path: Selenium Manager is skipped (it would otherwise look for downloads).
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


class Network:
    """Every request and response the pages made, from Chrome's DevTools performance log."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self.requests: list[str] = []
        self.status: dict[str, int] = {}

    def drain(self) -> None:
        for entry in self.driver.get_log("performance"):
            msg = json.loads(entry["message"])["message"]
            params = msg.get("params", {})
            if msg.get("method") == "Network.requestWillBeSent":
                self.requests.append(params["request"]["url"])
            elif msg.get("method") == "Network.responseReceived":
                self.status[params["response"]["url"]] = int(params["response"]["status"])


def _mnist(n: int, dim: int = 32) -> tuple[np.ndarray, np.ndarray]:
    with np.load(SHARED_DATA / "mnist10k.npz") as d:
        rows = np.random.default_rng(0).choice(d["y"].shape[0], size=n, replace=False)
        X = d["X"][rows].reshape(n, -1).astype(np.float32) / 255.0
        y = d["y"][rows].astype(np.int64)
    proj = np.random.default_rng(1).normal(0.0, 1.0 / np.sqrt(X.shape[1]), size=(X.shape[1], dim))
    emb = X @ proj
    return ((emb - emb.mean(axis=0)) / emb.std(axis=0)).astype(np.float32), y


def _setup_pool(http: httpx.Client) -> tuple[str, list[str], dict[str, str]]:
    n_train, n_val = 800, 200
    X, y = _mnist(n_train + n_val)
    ids = [f"digit-{i:04d}" for i in range(n_train + n_val)]
    truth = {i: DIGITS[int(c)] for i, c in zip(ids, y, strict=True)}
    r = http.post(
        "/v1/pools",
        json={"name": "mnist-digits", "task": "classification", "classes": DIGITS, "embedding_dim": 32,
              "head": {"kind": "linear"}},
    )  # fmt: skip
    assert r.status_code == 201, r.text
    pool = r.json()["id"]
    for part, split in ((slice(0, n_train), "train"), (slice(n_train, None), "validation")):
        buf = io.BytesIO()
        np.savez(buf, ids=np.asarray(ids[part]), embeddings=X[part])
        r = http.post(f"/v1/pools/{pool}/items:bulk", params={"split": split}, content=buf.getvalue())
        assert r.status_code == 200, r.text
    labeled = ids[n_train:] + ids[:60]  # every validation item, and 60 seed labels
    r = http.put(f"/v1/pools/{pool}/labels", json={"labels": [{"item_id": i, "label": truth[i]} for i in labeled]})
    assert r.status_code == 200, r.text
    return pool, ids, truth


def _shot(driver: Any, folder: Path, name: str) -> None:
    """The whole page (the window grows to the document's height for the shot)."""
    folder.mkdir(parents=True, exist_ok=True)
    height = int(driver.execute_script("return document.documentElement.scrollHeight;"))
    driver.set_window_size(1400, min(max(height, 700), 4000))
    time.sleep(0.3)  # charts resize with the window
    driver.save_screenshot(str(folder / f"{name}.png"))
    driver.set_window_size(1400, 1100)


def _request_batch(driver: Any, strategy: str, size: int) -> list[str]:
    """Submit the request form; returns the statuses the batches table showed, without a reload, until
    the new batch succeeded."""
    Select(driver.find_element(By.ID, "strategy")).select_by_value(strategy)
    size_box = driver.find_element(By.ID, "size")
    size_box.clear()
    size_box.send_keys(str(size))
    driver.find_element(By.ID, "request").click()
    flash = wait_for(lambda: driver.find_elements(By.ID, "flash"), 30, "no confirmation after requesting a batch")
    assert "requested" in flash[0].text, flash[0].text
    batch_id = flash[0].text.split()[1]
    driver.execute_script("window.__sameDocument = 'yes';")  # gone if the page reloads
    seen: list[str] = []

    def status() -> bool:
        s = _attr(driver, f"batch-{batch_id}", "data-status")
        if s and (not seen or seen[-1] != s):
            seen.append(s)
        return s in ("succeeded", "failed", "cancelled")

    wait_for(status, 180, lambda: f"batch {batch_id} did not finish; statuses seen {seen}")
    assert seen[-1] == "succeeded", seen
    assert driver.execute_script("return window.__sameDocument;") == "yes", "the page reloaded"
    return seen


#: What Chromium 156 answers, instead of a stale-element error, when the element was replaced between finding it
#: and reading it (an htmx swap): the page is changing under us, as with a stale element.
_REPLACED = "does not belong to the document"


def _attr(driver: Any, element_id: str, name: str) -> str | None:
    """An attribute of an element, or None while the page is changing under us."""
    try:
        value: str | None = driver.find_element(By.ID, element_id).get_attribute(name)
        return value
    except (NoSuchElementException, StaleElementReferenceException):
        return None
    except WebDriverException as exc:
        if _REPLACED in str(exc):
            return None
        raise


def _curve_points(driver: Any) -> int:
    text = _attr(driver, "curve-count", "textContent") or ""
    return int(text) if text.isdigit() else -1


def test_dashboard_in_chromium(deployment: tuple[str, dict[str, str]], browser: Any, tmp_path: Path) -> None:
    base, env = deployment
    shots = Path(os.environ["BAIT_SCREENSHOTS"]) if os.environ.get("BAIT_SCREENSHOTS") else tmp_path / "shots"
    if not shots.is_absolute():
        shots = ROOT / shots
    key = bait("keys", "create", "--tenant", "acme", env=env).strip().splitlines()[-1]
    other = bait("keys", "create", "--tenant", "globex", env=env).strip().splitlines()[-1]
    http = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=120)
    pool, _ids, truth = _setup_pool(http)
    r = httpx.post(
        f"{base}/v1/pools",
        headers={"Authorization": f"Bearer {other}"},
        json={"name": "theirs", "task": "classification", "classes": ["a", "b"], "embedding_dim": 2},
    )
    their_pool = r.json()["id"]
    driver = browser
    net = Network(driver)
    net.drain()  # Chromium's own start page (chrome://new-tab-page), before any page of ours
    net.requests.clear()
    t0 = time.monotonic()

    # sign in: the dashboard sends us to the login page, the key is exchanged for a session cookie
    driver.get(f"{base}/ui")
    assert urlsplit(driver.current_url).path == "/ui/login"
    _shot(driver, shots, "login")
    driver.find_element(By.ID, "api_key").send_keys(key)
    driver.find_element(By.ID, "sign-in").click()
    wait_for(lambda: driver.find_elements(By.ID, "pools"), 30, "no pools list after signing in")
    cookie = driver.get_cookie("bait_session")
    assert cookie and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert driver.execute_script("return document.cookie;") == ""  # scripts cannot read the session
    assert "theirs" not in driver.page_source  # only this tenant's pools
    _shot(driver, shots, "pools")

    # the pool page; the first batch trains the first head: the curve gets its first point
    driver.find_element(By.CSS_SELECTOR, "a.pool-link").click()
    wait_for(lambda: _curve_points(driver) == 0, 30, "the curve did not load")
    seen = _request_batch(driver, "bait", 10)
    assert seen[0] in ("queued", "running"), seen
    wait_for(lambda: _curve_points(driver) == 1, 30, "the curve did not gain its first point")
    wait_for(lambda: "round 1" in (_attr(driver, "map-info", "textContent") or ""), 30, "the map did not load")

    # the batch page: items in order with predicted class; label two of them by hand
    driver.find_element(By.CSS_SELECTOR, "a.batch-link").click()
    rows = wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "#items tbody tr[data-item]"), 30, "no items")
    assert len(rows) == 10
    chosen = [r.get_attribute("data-item") for r in rows]
    assert all(r.get_attribute("data-status") == "reserved" for r in rows)
    _shot(driver, shots, "batch")
    for position in (1, 2):
        row = driver.find_element(By.ID, f"item-{position}")
        item = row.get_attribute("data-item")
        Select(row.find_element(By.NAME, "value")).select_by_value(truth[item])
        row.find_element(By.CSS_SELECTOR, "form.label-form button").click()
        wait_for(
            lambda p=position: _attr(driver, f"item-{p}", "data-status") == "labeled",
            30,
            f"item {position} was not labeled",
        )
    page = http.get(f"/v1/pools/{pool}/items", params={"status": "labeled", "limit": 1000}).json()["items"]
    labels = {i["id"]: i.get("label") for i in page}
    assert labels[chosen[0]] == truth[chosen[0]] and labels[chosen[1]] == truth[chosen[1]]
    export = driver.find_element(By.ID, "export-csv").get_attribute("href")
    assert httpx.get(export, cookies={"bait_session": cookie["value"]}).text.count("\n") == 11

    # back to the pool: the next batch trains on the two new labels; the curve gains a point
    driver.find_element(By.LINK_TEXT, "mnist-digits").click()
    wait_for(lambda: _curve_points(driver) == 1, 30, "the curve did not load")
    _request_batch(driver, "margin", 10)
    wait_for(lambda: _curve_points(driver) == 2, 30, "the curve did not gain a point")
    curve = http.get(f"/v1/pools/{pool}/curve").json()["points"]
    assert [p["n_labels"] for p in curve] == [60, 62]
    assert all(p["n_validation"] == 200 for p in curve)
    time.sleep(0.5)  # let the charts finish drawing for the screenshot
    _shot(driver, shots, "pool")

    # another tenant's pool: 404, also in the dashboard
    driver.get(f"{base}/ui/pools/{their_pool}")
    assert driver.find_element(By.TAG_NAME, "h1").text == "404"
    net.drain()
    assert net.status.get(f"{base}/ui/pools/{their_pool}") == 404

    # the API docs render offline, from the vendored Swagger UI and ReDoc
    driver.get(f"{base}/docs")
    wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, ".swagger-ui .info .title"), 30, "Swagger UI did not render")
    _shot(driver, shots, "docs")
    driver.get(f"{base}/redoc")
    wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, ".api-content h1"), 30, "ReDoc did not render")

    # sign out: the session is gone
    driver.get(f"{base}/ui")
    driver.find_element(By.ID, "logout").click()
    wait_for(lambda: urlsplit(driver.current_url).path == "/ui/login", 30, "not signed out")
    driver.get(f"{base}/ui")
    assert urlsplit(driver.current_url).path == "/ui/login"

    # every request of every page went to the service itself
    net.drain()
    assert len(net.requests) > 20
    outside = [u for u in net.requests if not (u.startswith(base + "/") or u.startswith(("data:", "blob:")))]
    assert not outside, f"requests outside the service: {outside[:10]}"
    print(f"browser flow on {base} in {time.monotonic() - t0:.1f} s, {len(net.requests)} requests, all local")
    if shots != tmp_path / "shots":
        shutil.rmtree(tmp_path / "shots", ignore_errors=True)


SVG_ATTACK = """<svg xmlns="http://www.w3.org/2000/svg" width="100" height="100"><script>
fetch('/ui/pools/POOL', {credentials: 'include'}).then(r => r.text()).then(page => {
  const csrf = page.match(/name="csrf" value="([^"]+)"/)[1];
  const form = new FormData();
  form.append('item_id', 'victim'); form.append('value', 'cat'); form.append('csrf', csrf); form.append('back', '/ui');
  return fetch('/ui/pools/POOL/labels', {method: 'POST', body: form, credentials: 'include'});
}).then(() => { document.title = 'pwned'; });
</script><circle cx="50" cy="50" r="40"/></svg>"""


def test_svg_behind_a_content_link_runs_nothing(tmp_path: Path, browser: Any) -> None:
    """Issue 24, finding 5: a tenant's SVG whose script reads the dashboard's CSRF token and writes a label,
    opened through its signed content link in a browser signed in to /ui. The link serves it as a
    sandboxed attachment (nosniff, ``default-src 'none'; sandbox``): nothing runs, nothing is written."""
    from service.config import Settings
    from service.domain import content

    root = tmp_path / "files"
    (root / "acme").mkdir(parents=True)
    db_url = f"sqlite:///{tmp_path / 'data' / 'bait.db'}"
    env = bait_env(db_url, None, "bait", data_root=str(root))
    server, base = serve(env, tmp_path / "serve.log", migrate=True)
    try:
        key = bait("keys", "create", "--tenant", "acme", env=env).strip().splitlines()[-1]
        http = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60)
        body = {"name": "svg", "task": "classification", "classes": ["cat", "dog"], "embedding_dim": 2}
        pool = http.post("/v1/pools", json=body).json()["id"]
        (root / "acme" / "evil.svg").write_text(SVG_ATTACK.replace("POOL", pool))
        items = [
            {"id": "evil", "embedding": [1.0, 0.0], "data": {"image": f"file://{root}/acme/evil.svg"}},
            {"id": "victim", "embedding": [0.0, 1.0]},
        ]
        assert http.post(f"/v1/pools/{pool}/items", json={"items": items}).status_code == 200
        settings = Settings(database_url=db_url, secret_key=env["BAIT_SECRET_KEY"], data_root=root)
        link = f"{base}/labelstudio/content/{content.sign(settings, pool, 'evil', 'image', 600)}"
        head = httpx.get(link)
        assert head.status_code == 200 and head.headers["content-disposition"].startswith("attachment")

        browser.execute_cdp_cmd(
            "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(tmp_path / "downloads")}
        )
        browser.get(f"{base}/ui")
        browser.find_element(By.ID, "api_key").send_keys(key)
        browser.find_element(By.ID, "sign-in").click()
        wait_for(lambda: browser.find_elements(By.ID, "pools"), 30, "not signed in")
        net = Network(browser)
        net.drain()
        net.requests.clear()
        browser.get(link)
        time.sleep(3)  # time for a script to fetch the page and post the label, had it run
        net.drain()
        assert browser.title != "pwned"
        assert [u for u in net.requests if "/ui/" in u] == [], net.requests  # the script never ran
        labeled = http.get(f"/v1/pools/{pool}/items", params={"status": "labeled"}).json()["items"]
        assert labeled == []  # nothing written as the signed-in user
        # the same file opened through the dashboard's origin is never rendered there as a document either
        assert "svg" not in (browser.execute_script("return document.contentType;") or "")
    finally:
        server.stop()
