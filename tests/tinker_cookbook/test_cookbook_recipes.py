"""The tinker-cookbook, unmodified, as a conformance suite against the tiny Twinkle server.

Each recipe runs a few steps in the cookbook's own venv (``tools/make_cookbook_venv.sh``), pointed
at the server by ``TINKER_BASE_URL`` and a ``tml-`` key; each test reads what the recipe logged
(``metrics.jsonl``, ``checkpoints.jsonl``) and lists the checkpoints through the SDK.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
from recipe_server import (
    API_KEY,
    MODEL_NAME,
    CookbookServer,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DPO_DRIVER = Path(__file__).with_name("dpo_comparisons.py")
RENDERER = "qwen3_5"  # the tiny tokenizer carries Qwen's <|im_start|>/<|im_end|>/<think> tokens
COMMON = [f"model_name={MODEL_NAME}", "behavior_if_log_dir_exists=delete"]
STABLE_REINFORCE_MISSING = "unknown loss_fn 'stable_reinforce'"


def run_cookbook(server: CookbookServer, *args: str, timeout_s: float = 900) -> str:
    """``$TWINKLE_COOKBOOK_PYTHON <args>``; returns the merged output of a run that exited 0."""
    result = run_cookbook_unchecked(server, *args, timeout_s=timeout_s)
    assert result.returncode == 0, f"{' '.join(args)} exited {result.returncode}:\n" + _tail(result)
    return result.stdout


def run_cookbook_unchecked(server: CookbookServer, *args: str, timeout_s: float = 900):
    return subprocess.run(
        [server.env["TWINKLE_COOKBOOK_PYTHON"], *args],
        env=server.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, errors="replace", timeout=timeout_s,
    )  # fmt: skip


def _tail(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in result.stdout.splitlines() if line[:1] not in "│┃━┏┗┡└<"]
    return "\n".join(lines[-60:])


def cookbook_data(server: CookbookServer, name: str) -> str:
    """A file of the installed cookbook's ``example_data``."""
    code = "import pathlib, tinker_cookbook; print(pathlib.Path(tinker_cookbook.__file__).parent)"
    root = run_cookbook(server, "-c", code).strip().splitlines()[-1]
    return str(Path(root) / "example_data" / name)


def logged_metrics(log_path: Path, key: str) -> list[dict]:
    """The rows of ``metrics.jsonl`` that carry ``key`` (the last one holds only final timings)."""
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if key in row]


def assert_checkpoints_listed(server: CookbookServer, log_path: Path) -> None:
    """Every checkpoint the recipe recorded is listed by the SDK's RestClient."""
    import tinker

    lines = (log_path / "checkpoints.jsonl").read_text().splitlines()
    recorded = [json.loads(line) for line in lines]
    assert recorded and recorded[-1]["name"] == "final"
    run_id = recorded[-1]["state_path"].removeprefix("tinker://").split("/")[0]
    client = tinker.RestClient(base_url=server.base_url, api_key=API_KEY)
    listed = {c.tinker_path for c in client.list_checkpoints(run_id).result().checkpoints}
    for record in recorded:
        assert record["state_path"] in listed, (record, sorted(listed))
        assert record["sampler_path"] in listed, (record, sorted(listed))


def test_chat_sl_on_the_example_conversations(cookbook_server, tmp_path):
    log_path = tmp_path / "chat_sl"
    output = run_cookbook(
        cookbook_server, "-m", "tinker_cookbook.recipes.chat_sl.train", *COMMON,
        f"dataset={cookbook_data(cookbook_server, 'conversations.jsonl')}",
        "batch_size=8", "max_steps=4", "lora_rank=8", "learning_rate=1e-3", "max_length=512",
        "save_every=2", "eval_every=0", f"log_path={log_path}",
    )  # fmt: skip
    assert "Training completed successfully" in output
    nll = [row["train_mean_nll"] for row in logged_metrics(log_path, "train_mean_nll")]
    assert len(nll) == 4 and nll[-1] < nll[0], nll
    assert_checkpoints_listed(cookbook_server, log_path)


def test_sl_basic_with_the_example_conversations(cookbook_server, tmp_path):
    # sl_basic's own dataset (HuggingFaceH4/no_robots) needs the Hub; chz swaps in the file builder.
    log_path = tmp_path / "sl_basic"
    common = "dataset_builder.common_config"
    output = run_cookbook(
        cookbook_server, "-m", "tinker_cookbook.recipes.sl_basic", f"model_name={MODEL_NAME}",
        "dataset_builder=tinker_cookbook.supervised.data:FromConversationFileBuilder",
        f"dataset_builder.file_path={cookbook_data(cookbook_server, 'conversations.jsonl')}",
        f"{common}.model_name_for_tokenizer={MODEL_NAME}", f"{common}.renderer_name={RENDERER}",
        f"{common}.train_on_what=all_assistant_messages", f"{common}.batch_size=8",
        f"{common}.max_length=512", "max_steps=4", "lora_rank=8", "learning_rate=1e-3",
        "save_every=2", "eval_every=0", f"log_path={log_path}",
    )  # fmt: skip
    assert "Training completed successfully" in output
    nll = [row["train_mean_nll"] for row in logged_metrics(log_path, "train_mean_nll")]
    assert len(nll) == 4 and nll[-1] < nll[0], nll
    assert_checkpoints_listed(cookbook_server, log_path)


def math_rl_args(log_path: Path) -> list[str]:
    return [
        "-m", "tinker_cookbook.recipes.math_rl.train", *COMMON, "env=arithmetic", "group_size=4",
        "groups_per_batch=4", "max_tokens=5", "max_steps=3", "lora_rank=8",
        "learning_rate=1e-4", "eval_every=0", "save_every=2", f"log_path={log_path}",
    ]  # fmt: skip


def assert_rl_logged(log_path: Path, steps: int) -> None:
    rows = logged_metrics(log_path, "env/all/reward/total")
    assert len(rows) == steps, rows
    for row in rows:
        assert math.isfinite(row["env/all/reward/total"]), row
        assert row["env/all/total_ac_tokens"] > 0, row


def test_math_rl_arithmetic_with_its_default_loss(cookbook_server, tmp_path):
    log_path = tmp_path / "math_rl"
    result = run_cookbook_unchecked(cookbook_server, *math_rl_args(log_path))
    if result.returncode != 0 and STABLE_REINFORCE_MISSING in result.stdout:
        pytest.xfail("the server does not implement loss_fn 'stable_reinforce' (math_rl's default)")
    assert result.returncode == 0, _tail(result)
    assert_rl_logged(log_path, steps=3)
    assert_checkpoints_listed(cookbook_server, log_path)


def test_math_rl_arithmetic_with_importance_sampling(cookbook_server, tmp_path):
    log_path = tmp_path / "math_rl_is"
    output = run_cookbook(cookbook_server, *math_rl_args(log_path), "loss_fn=importance_sampling")
    assert "Training completed successfully" in output
    assert_rl_logged(log_path, steps=3)
    assert all("env/all/correct" in row for row in logged_metrics(log_path, "env/all/reward/total"))
    assert_checkpoints_listed(cookbook_server, log_path)


def test_multiplayer_guess_number(cookbook_server, tmp_path):
    log_path = tmp_path / "guess_number"
    output = run_cookbook(
        cookbook_server, "-m", "tinker_cookbook.recipes.multiplayer_rl.guess_number.train",
        *COMMON, "group_size=2", "batch_size=2", "max_tokens=16", "max_steps=2",
        "learning_rate=1e-4", "eval_every=0", "save_every=1", f"log_path={log_path}",
    )  # fmt: skip
    assert "Training completed successfully" in output
    assert_rl_logged(log_path, steps=2)
    assert_checkpoints_listed(cookbook_server, log_path)


def test_dpo_on_a_jsonl_of_comparisons(cookbook_server, tmp_path):
    log_path = tmp_path / "dpo"
    output = run_cookbook(cookbook_server, str(DPO_DRIVER), f"--log-path={log_path}")
    assert "DPO training completed successfully" in output
    rows = logged_metrics(log_path / "run", "dpo_loss")
    losses = [row["dpo_loss"] for row in rows]
    # The reference is the initial policy: its logprobs (sampler) equal the trainer's at step 0.
    assert losses[0] == pytest.approx(math.log(2), abs=1e-3), losses
    assert len(losses) == 4 and losses[-1] < losses[0], losses
    assert rows[-1]["accuracy"] > 0.5, rows[-1]
    assert_checkpoints_listed(cookbook_server, log_path / "run")
