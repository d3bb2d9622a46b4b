"""One tenant's long rows within a replica's memory budget (slow tier).

tinker-cookbook's ``multiplayer_rl.guess_number`` recipe, unmodified, with ``group_size=4
batch_size=8`` against the tiny server at ``max_length: 4096``: each ``forward_backward`` carries
~320 multi-turn rows padded to ~840 tokens, one pass of ~270k tokens (about 16 GB of activations
and logits at this model's shape). With ``execution.memory_budget_mb`` the model runs that batch
as row chunks: the server's resident memory stays under the budget, it answers its health check
throughout, and the recipe completes.
"""

from __future__ import annotations

import threading
import time

import httpx
import psutil
import pytest
from recipe_server import MODEL_NAME, launched_cookbook_server
from test_cookbook_recipes import assert_rl_logged, logged_metrics, run_cookbook

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BUDGET_MB = 3000


class Watch:
    """Samples the server's resident memory and its health check every ``interval_s``."""

    def __init__(self, pid: int, base_url: str, interval_s: float = 0.5) -> None:
        self.process = psutil.Process(pid)
        self.base_url, self.interval_s = base_url, interval_s
        self.peak_mb = 0.0
        self.health: list[tuple[int, float]] = []  # (status, seconds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                rss = self.process.memory_info().rss / 2**20
                self.peak_mb = max(self.peak_mb, rss)
                start = time.perf_counter()
                try:
                    status = client.get(f"{self.base_url}/api/v1/healthz").status_code
                except httpx.HTTPError:
                    status = 0
                self.health.append((status, time.perf_counter() - start))
                self._stop.wait(self.interval_s)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def test_guess_number_with_long_rows_stays_within_the_memory_budget(tmp_path):
    root = tmp_path / "server"
    root.mkdir()
    with launched_cookbook_server(root, execution={"memory_budget_mb": BUDGET_MB}) as server:
        log_path = tmp_path / "guess_number"
        with Watch(server.pid, server.base_url) as watch:
            start = time.perf_counter()
            output = run_cookbook(
                server, "-m", "tinker_cookbook.recipes.multiplayer_rl.guess_number.train",
                f"model_name={MODEL_NAME}", "behavior_if_log_dir_exists=delete",
                "group_size=4", "batch_size=8", "max_tokens=16", "max_steps=2",
                "learning_rate=1e-4", "eval_every=0", "save_every=0", f"log_path={log_path}",
                timeout_s=1500,
            )  # fmt: skip
            seconds = time.perf_counter() - start
        assert "Training completed successfully" in output
        assert_rl_logged(log_path, steps=2)
        statuses = [status for status, _ in watch.health]
        slowest = max(s for _, s in watch.health)
        print(
            f"guess_number g4 b8 at max_length 4096: {seconds:.0f} s, server peak RSS "
            f"{watch.peak_mb:.0f} MB (budget {BUDGET_MB}), {len(statuses)} health checks, "
            f"slowest {slowest:.2f} s"
        )
        # The recipe's own per-step timings: ``time/train_step`` is its forward_backward and
        # optim_step calls, ``time/total`` the whole step with sampling.
        for step, row in enumerate(logged_metrics(log_path, "env/all/reward/total")):
            print(
                f"guess_number step {step}: train_step {row['time/train_step']:.1f} s, "
                f"step {row['time/total']:.1f} s"
            )
        assert watch.peak_mb < BUDGET_MB
        assert len(statuses) > 20 and set(statuses) == {200}
        assert slowest < 5.0
