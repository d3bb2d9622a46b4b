"""DPO through the tinker-cookbook's Python API, on a jsonl of comparisons.

Run with the cookbook's interpreter (not the project's: the cookbook pins transformers <= 5.5.4)::

    TINKER_BASE_URL=http://127.0.0.1:PORT TINKER_API_KEY=tml-... \
        $TWINKLE_COOKBOOK_PYTHON tests/tinker_cookbook/dpo_comparisons.py --log-path /tmp/dpo

The comparisons come from the cookbook's own ``example_data/conversations.jsonl``: the prompt is a
conversation without its last assistant reply, completion A is that reply (preferred), completion B
is the reply of another conversation. One batch, several epochs: the DPO loss on it must fall.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import tinker_cookbook
from tinker_cookbook.preference import train_dpo
from tinker_cookbook.preference.dpo_datasets import DPODatasetBuilderFromComparisons
from tinker_cookbook.preference.preference_datasets import ComparisonBuilderFromJsonl
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

CONVERSATIONS = Path(tinker_cookbook.__file__).parent / "example_data" / "conversations.jsonl"


def write_comparisons(path: Path, limit: int) -> int:
    """Write ``{"comparison": {...}, "label": "A"}`` rows; returns how many."""
    rows = [json.loads(line)["messages"] for line in CONVERSATIONS.read_text().splitlines() if line]
    rows = [messages for messages in rows if messages[-1]["role"] == "assistant"][:limit]
    with path.open("w") as out:
        for i, messages in enumerate(rows):
            other = rows[(i + 1) % len(rows)]
            comparison = {
                "prompt_conversation": messages[:-1],
                "completion_A": [messages[-1]],
                "completion_B": [other[-1]],
            }
            out.write(json.dumps({"comparison": comparison, "label": "A"}) + "\n")
    return len(rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-path", required=True)
    parser.add_argument("--model-name", default="Qwen/Qwen3.5-4B")
    parser.add_argument("--renderer-name", default="qwen3_5")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=4, help="passes over one batch")
    args = parser.parse_args()

    log_path = Path(args.log_path)
    log_path.mkdir(parents=True, exist_ok=True)
    comparisons = log_path / "comparisons.jsonl"
    write_comparisons(comparisons, limit=args.batch_size)
    common = ChatDatasetBuilderCommonConfig(
        model_name_for_tokenizer=args.model_name,
        renderer_name=args.renderer_name,
        max_length=512,
        batch_size=args.batch_size,
    )
    config = train_dpo.Config(
        log_path=str(log_path / "run"),
        model_name=args.model_name,
        recipe_name="twinkle_conformance_dpo",
        renderer_name=args.renderer_name,
        dataset_builder=DPODatasetBuilderFromComparisons(
            common_config=common,
            comparison_builder=ComparisonBuilderFromJsonl(train_path=str(comparisons)),
        ),
        learning_rate=1e-3,
        dpo_beta=0.1,
        lora_rank=8,
        save_every=2,
        eval_every=0,
        num_epochs=args.epochs,
    )
    train_dpo.main(config)


if __name__ == "__main__":
    main()
