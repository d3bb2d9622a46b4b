"""Screenshots of every console page for docs/console.md, taken in headless chromium.

Builds an in-process server (tiny://qwen3, torch sampler) with two tenants and an operator key,
trains the tenants a few steps, saves and publishes a checkpoint, then opens each page and saves
``docs/console/<page>.png``. Needs Debian's ``chromium`` and ``chromium-driver`` and selenium.

Usage: python tools/console_screenshots.py [--out docs/console]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import uvicorn

KEYS = {"alice": "alice-console-key-1", "bob": "bob-console-key-2", "ops": "ops-console-key-3"}
BASE = "tiny/qwen3"
MODEL = f"/api/v1/model/{BASE}"
ROWS = [
    {"input_ids": list(range(10 + i, 42 + i)), "labels": list(range(10 + i, 42 + i))}
    for i in range(4)
]


def build_server(storage: Path):
    from twinkle.server.config import parse_config
    from twinkle.server.process.local import build_local_server
    from twinkle.server.state import MemoryStore

    os.environ["TWINKLE_CONSOLE_ADMIN_KEYS"] = KEYS["ops"]
    config = {
        "auth": {"api_keys": list(KEYS.values())},
        "storage": {"root": str(storage)},
        "applications": [
            {"name": "server", "route_prefix": "/api/v1", "import_path": "server", "args": {}},
            {
                "name": "model",
                "route_prefix": MODEL,
                "import_path": "model",
                "args": {"backend": "transformers", "model_id": "tiny://qwen3", "max_loras": 8},
            },
            {
                "name": "sampler",
                "route_prefix": f"/api/v1/sampler/{BASE}",
                "import_path": "sampler",
                "args": {"model_id": "tiny://qwen3", "sampler_type": "torch"},
            },
        ],
    }
    return build_local_server(parse_config(config), store=MemoryStore("screens:"))


def serve(app) -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    threading.Thread(target=server.run, daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/api/v1/healthz", timeout=1).status_code == 200:
                return url
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit("the server did not start")


def call(http: httpx.Client, op: str, body: dict) -> dict:
    response = http.post(f"{MODEL}/{op}", json=body)
    response.raise_for_status()
    return response.json()


def train_tenant(url: str, who: str, adapter: str, steps: int, lr: float) -> dict:
    """Train ``steps`` steps; save a checkpoint halfway and at the end; publish it live."""
    headers = {"Authorization": f"Bearer {KEYS[who]}"}
    with httpx.Client(base_url=url, headers=headers, timeout=300) as http:
        call(http, "add_adapter_to_model", {"adapter_name": adapter, "config": {"r": 8}})
        call(http, "set_optimizer", {"adapter_name": adapter, "optimizer": "AdamW", "lr": lr})
        for step in range(1, steps + 1):
            call(http, "forward_backward", {"adapter_name": adapter, "inputs": ROWS})
            call(http, "clip_grad_and_step", {"adapter_name": adapter, "max_grad_norm": 1.0})
            if step in (steps // 2, steps):
                call(http, "save", {"adapter_name": adapter, "name": f"step-{step}"})
        http.post(
            "/api/v1/publish_live_adapter", json={"base_model": BASE, "adapter_name": adapter}
        ).raise_for_status()
        status = http.get(f"{MODEL}/status").json()
        (run,) = [t["training_run_id"] for t in status["tenants"] if t["adapter_name"] == adapter]
        return {"run": run, "headers": headers}


def browser(profile: str):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
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
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        "--window-size=1280,900",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def wait(driver, condition, timeout: float = 60.0) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout, poll_frequency=0.1).until(condition)


def shot(driver, path: Path) -> None:
    """The whole page (the window grown to the page's height), then back to 900 px."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, max(600, min(int(height) + 20, 2400)))
    time.sleep(0.3)  # one frame for the resized layout
    driver.save_screenshot(str(path))
    driver.set_window_size(1280, 900)
    print("wrote", path)


def login(driver, url: str, key: str) -> None:
    driver.get(url + "/api/v1/console/")
    driver.execute_script("sessionStorage.clear(); location.hash = '';")
    driver.get(url + "/api/v1/console/")
    driver.find_element("id", "api-key").send_keys(key)
    driver.find_element("id", "login-button").click()
    wait(driver, lambda d: d.find_element("id", "page-runs").is_displayed())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/console"))
    args = parser.parse_args(argv)
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        print("needs chromium and chromedriver (apt-get install chromium chromium-driver)")
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        server = build_server(Path(tmp) / "storage")
        url = serve(server.app)
        alice = train_tenant(url, "alice", "sft-alice", 24, 2e-2)
        train_tenant(url, "bob", "sft-bob", 10, 1e-2)
        time.sleep(1.0)  # the history writer stores the last steps a moment after them
        driver = browser(str(Path(tmp) / "profile"))
        try:
            take_pages(driver, url, alice, args.out)
        finally:
            driver.quit()
    return 0


def take_pages(driver, url: str, alice: dict, out: Path) -> None:
    driver.get(url + "/api/v1/console/")
    driver.execute_script("sessionStorage.clear()")
    driver.get(url + "/api/v1/console/")
    shot(driver, out / "login.png")
    login(driver, url, KEYS["alice"])
    wait(driver, lambda d: d.find_elements("css selector", "#runs-table tr.run-row"))
    shot(driver, out / "runs.png")

    driver.execute_script(f"location.hash = '#/run/{alice['run']}'")
    wait(driver, lambda d: int(d.find_element("id", "curve").get_attribute("data-points")) >= 24)
    wait(driver, lambda d: d.find_elements("css selector", "#checkpoints tr.ckpt-row"))
    driver.find_elements("css selector", "#checkpoints tr.ckpt-row button.open")[-1].click()
    wait(driver, lambda d: d.find_element("id", "ckpt-info").text)
    driver.execute_script("window.scrollTo(0, 0)")
    shot(driver, out / "run.png")

    driver.execute_script("location.hash = '#/sessions'")
    wait(driver, lambda d: d.find_elements("css selector", "#sessions-table tr.session-row"))
    shot(driver, out / "sessions.png")

    driver.execute_script("location.hash = '#/queue'")
    wait(driver, lambda d: d.find_elements("css selector", "#model-queue-table tr"))
    shot(driver, out / "queue.png")

    driver.execute_script("location.hash = '#/playground/model=inflight://sft-alice'")
    wait(driver, lambda d: d.find_elements("css selector", "#pg-model option"))
    driver.find_element("id", "pg-input").send_keys("Name a colour.")
    driver.find_element("id", "pg-send").click()
    wait(driver, lambda d: d.find_elements("css selector", "#pg-transcript .msg.assistant"))
    shot(driver, out / "playground.png")

    login(driver, url, KEYS["ops"])
    driver.execute_script("location.hash = '#/admin'")
    wait(
        driver, lambda d: len(d.find_elements("css selector", "#tenants-table tr.tenant-row")) >= 2
    )
    wait(driver, lambda d: d.find_elements("css selector", "#capacity-table tr.capacity-row"))
    shot(driver, out / "admin.png")


if __name__ == "__main__":
    sys.exit(main())
