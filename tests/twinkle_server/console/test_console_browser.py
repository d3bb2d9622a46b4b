"""The console in a real headless browser (Debian's chromium + chromium-driver, with selenium).

Log in, watch a curve grow while the tenant trains, open a checkpoint, chat in the playground
with it and with the live adapter, and see that another key's runs are absent. Skipped, saying
why, on a machine without the browser, its driver or selenium (``.ci/run`` installs them).
"""

from __future__ import annotations

import os
import shutil
import threading

import httpx
import pytest
from console_server import KEYS, add_adapter, auth, run_of, train

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
try:
    import selenium  # noqa: F401
except ImportError:
    selenium = None

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None or selenium is None,
    reason="needs chromium, chromedriver (Debian: apt-get install chromium chromium-driver) and "
    f"selenium; found chromium={CHROMIUM}, chromedriver={CHROMEDRIVER}, "
    f"selenium={'yes' if selenium else 'no'}",
)
WAIT_S = 30


def chromium_driver(user_data_dir, width: int = 1280, height: int = 900):
    """Headless chromium for a machine without network or GPU, with a fresh profile."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager go online
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={user_data_dir}",
        f"--window-size={width},{height}",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = chromium_driver(tmp_path_factory.mktemp("chromium-profile"))
    yield driver
    driver.quit()


def wait_for(driver, condition, what: str, timeout: float = WAIT_S):
    """``condition(driver)``'s first truthy value within ``timeout`` seconds."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(
        condition, message=f"timed out waiting for {what}"
    )


def visible(driver, element_id: str) -> bool:
    return driver.find_element("id", element_id).is_displayed()


def login(driver, url: str, who: str) -> None:
    driver.get(url + "/api/v1/console/")
    driver.execute_script("sessionStorage.clear(); location.hash = '';")
    driver.get(url + "/api/v1/console/")
    wait_for(driver, lambda d: visible(d, "api-key"), "the login form")
    driver.find_element("id", "api-key").send_keys(KEYS[who])
    driver.find_element("id", "login-button").click()
    wait_for(driver, lambda d: visible(d, "page-runs"), f"{who}'s runs page")


def run_ids_shown(driver) -> set[str]:
    rows = driver.find_elements("css selector", "#runs-table tr.run-row")
    return {row.get_attribute("data-run-id") for row in rows}


def test_a_wrong_key_is_refused_and_a_tenant_sees_its_runs(browser, url, alice_run):
    run_id, _ = alice_run
    browser.get(url + "/api/v1/console/")
    browser.execute_script("sessionStorage.clear()")
    browser.get(url + "/api/v1/console/")
    browser.find_element("id", "api-key").send_keys("not-a-key")
    browser.find_element("id", "login-button").click()
    error = wait_for(
        browser,
        lambda d: visible(d, "login-error") and d.find_element("id", "login-error"),
        "the login error",
    )
    assert error.text == "This key is not accepted."
    assert not visible(browser, "nav")
    login(browser, url, "alice")
    wait_for(browser, lambda d: run_id in run_ids_shown(d), "alice's run in the table")
    assert not visible(browser, "nav-admin")


def test_the_curve_grows_while_the_tenant_trains(browser, url, alice_run):
    with httpx.Client(base_url=url, headers=auth("alice"), timeout=120) as http:
        add_adapter(http, "growing")
        train(http, "growing", 1)
        run_id = run_of(http, "growing")
    login(browser, url, "alice")
    browser.execute_script(f"location.hash = '#/run/{run_id}'")

    def plotted(driver) -> int:
        return int(driver.find_element("id", "curve").get_attribute("data-points") or 0)

    first = wait_for(browser, lambda d: plotted(d) >= 1 and plotted(d), "the first point")
    failures: list[BaseException] = []

    def keep_training() -> None:
        try:
            with httpx.Client(base_url=url, headers=auth("alice"), timeout=120) as http:
                train(http, "growing", 4, pause_s=0.3)
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            failures.append(exc)

    trainer = threading.Thread(target=keep_training)
    trainer.start()
    try:
        grown = wait_for(browser, lambda d: plotted(d) > first and plotted(d), "a new point")
        assert grown > first
        assert len(browser.find_elements("css selector", "#curve circle.point")) == grown
    finally:
        trainer.join(timeout=120)
    assert not failures
    wait_for(browser, lambda d: plotted(d) == first + 4, "every step of the run")
    status = browser.find_element("id", "curve-status").text
    assert status.startswith(f"{first + 4} steps recorded")


def test_open_a_checkpoint_then_chat_with_it_and_with_the_live_adapter(browser, url, alice_run):
    run_id, path = alice_run
    login(browser, url, "alice")
    browser.execute_script(f"location.hash = '#/run/{run_id}'")
    row = wait_for(
        browser,
        lambda d: d.find_elements("css selector", f'#checkpoints tr[data-path="{path}"]'),
        "the checkpoint row",
    )[0]
    row.find_element("css selector", "button.open").click()
    wait_for(browser, lambda d: visible(d, "checkpoint-detail"), "the checkpoint's details")
    assert browser.find_element("id", "ckpt-path").text == path
    facts = wait_for(browser, lambda d: d.find_element("id", "ckpt-info").text, "its facts")
    assert "LoRA rank\n8" in facts and "tiny/qwen3" in facts
    row_expiry = f'#checkpoints tr[data-path="{path}"] td:nth-child(5)'
    assert browser.find_element("css selector", row_expiry).text == "never"
    browser.find_element("id", "ckpt-ttl").send_keys("86400")
    browser.find_element("id", "ckpt-set-ttl").click()
    wait_for(
        browser,
        lambda d: d.find_element("id", "ckpt-output").text.startswith("Expires: "),
        "the new expiry",
    )
    wait_for(
        browser,
        lambda d: d.find_element("css selector", row_expiry).text not in ("", "never"),
        "the expiry in the checkpoint table",
    )

    browser.find_element("id", "ckpt-chat").click()
    wait_for(browser, lambda d: visible(d, "page-playground"), "the playground")
    wait_for(
        browser,
        lambda d: d.execute_script("return document.getElementById('pg-model').value") == path,
        "the checkpoint chosen in the playground",
    )
    options = [
        o.get_attribute("value") for o in browser.find_elements("css selector", "#pg-model option")
    ]
    assert options[0] == "tiny/qwen3" and "inflight://ca" in options and path in options
    for model in (path, "inflight://ca"):
        browser.execute_script("document.getElementById('pg-model').value = arguments[0]", model)
        before = len(browser.find_elements("css selector", "#pg-transcript .msg.assistant"))
        browser.find_element("id", "pg-max-tokens").clear()
        browser.find_element("id", "pg-max-tokens").send_keys("6")
        browser.find_element("id", "pg-input").send_keys("Name a colour.")
        browser.find_element("id", "pg-send").click()
        wait_for(
            browser,
            lambda d, n=before: (
                len(d.find_elements("css selector", "#pg-transcript .msg.assistant")) > n
            ),
            f"{model}'s reply",
        )
        assert not visible(browser, "pg-error")
    users = browser.find_elements("css selector", "#pg-transcript .msg.user")
    assert [u.text.splitlines()[-1] for u in users] == ["Name a colour."] * 2


def test_another_key_sees_none_of_alices_runs(browser, url, alice_run):
    run_id, _ = alice_run
    with httpx.Client(base_url=url, headers=auth("bob"), timeout=120) as http:
        add_adapter(http, "bobs")
        bob_run = run_of(http, "bobs")
    login(browser, url, "bob")
    wait_for(browser, lambda d: bob_run in run_ids_shown(d), "bob's own run")
    assert run_id not in run_ids_shown(browser)
    assert not visible(browser, "nav-admin")
    browser.execute_script(f"location.hash = '#/run/{run_id}'")
    error = wait_for(
        browser, lambda d: visible(d, "error") and d.find_element("id", "error").text, "the refusal"
    )
    assert "not found" in error.lower() or "no " in error.lower()
    browser.execute_script("location.hash = '#/admin'")
    wait_for(browser, lambda d: visible(d, "page-runs"), "the runs page instead")


def test_an_operator_sees_every_tenant(browser, url, alice_run):
    from twinkle.server.state.paths import tenant_id_for_key

    login(browser, url, "admin")
    assert visible(browser, "nav-admin")
    browser.find_element("id", "nav-admin").click()
    alice = tenant_id_for_key(KEYS["alice"])
    wait_for(
        browser,
        lambda d: d.find_elements("css selector", f'#tenants-table tr[data-tenant="{alice}"]'),
        "alice's row in the operator view",
    )
    capacity = browser.find_element("css selector", "#capacity-table tr.capacity-row").text
    assert capacity.startswith("tiny/qwen3 4 ")
