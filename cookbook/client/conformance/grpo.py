# GRPO through the Twinkle client, in ModelScope Twinkle's style: GSM8K prompts encoded on this
# machine, completions sampled on the server with (token_id, logprob) pairs, rewards scored from
# new_input_feature, group advantages, CompletionRewardMetric, and GRPOLoss with old_logps.
import os

from peft import LoraConfig

from twinkle import get_logger, init_twinkle_client
from twinkle.advantage import GRPOAdvantage
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.metric import CompletionRewardMetric
from twinkle.preprocessor.llm import GSM8KProcessor
from twinkle.reward import GSM8KAccuracyReward
from twinkle.reward.base import Reward

logger = get_logger()
MODEL_ID = f"ms://{os.environ.get('TWINKLE_MODEL_ID', 'Qwen/Qwen3.5-4B')}"
NUM_GENERATIONS = 4


class BrevityReward(Reward):
    """Shorter answers score higher: a signal a random tiny model does produce."""

    def __call__(self, trajectories, ground_truths=None):
        return [1.0 / (1 + len(t["messages"][-1]["content"])) for t in trajectories]


client = init_twinkle_client(
    base_url=os.environ.get("TWINKLE_SERVER_URL", "http://localhost:8000"),
    api_key=os.environ.get("TWINKLE_SERVER_TOKEN", "EMPTY_TOKEN"),
)
dataset = Dataset(
    DatasetMeta("ms://modelscope/gsm8k", subset_name="main", split="train", data_slice=range(4))
)
dataset.set_template("Qwen3_5Template", model_id=MODEL_ID, max_length=256)
dataset.map(GSM8KProcessor())
dataset.encode(add_generation_prompt=True)
dataloader = DataLoader(dataset=dataset, batch_size=2)

model = client.model(MODEL_ID)
model.add_adapter_to_model("default", LoraConfig(target_modules="all-linear", r=8, lora_alpha=32))
model.set_loss("GRPOLoss", epsilon=0.2, beta=0.0)
model.set_optimizer("Adam", lr=1e-3)
model.set_processor("InputProcessor")
model.set_template("Qwen3_5Template", model_id=MODEL_ID)
sampler = client.sampler(MODEL_ID)
sampler.set_template("Qwen3_5Template", model_id=MODEL_ID)

advantage_fn = GRPOAdvantage()
metrics = CompletionRewardMetric()
params = {
    "max_tokens": 16,
    "temperature": 1.0,
    "top_p": 0.95,
    "num_samples": NUM_GENERATIONS,
    "logprobs": 1,
}
trained = 0
for step, batch in enumerate(dataloader):
    metrics.reset()
    uri = model.save(
        name="grpo-sampler-weights", save_optimizer=False, is_sampler=True
    ).twinkle_path
    responses = sampler.sample(inputs=batch, sampling_params=params, adapter_uri=uri)
    inputs, old_logps, lengths = [], [], []
    for response in responses:
        for sequence in response.sequences:
            inputs.append(sequence.new_input_feature)
            old_logps.append([lp[0][1] for lp in sequence.logprobs])
            lengths.append(len(sequence.tokens))
    assert len(inputs) == 2 * NUM_GENERATIONS
    assert all(dict(f["user_data"]).get("ground_truth") for f in inputs)  # the answer rode along
    accuracy = GSM8KAccuracyReward()(inputs, [])
    brevity = BrevityReward()(inputs, [])
    total = [a + b for a, b in zip(accuracy, brevity)]
    metrics.accumulate(
        None, None, completion_lengths=lengths, rewards={"total": total, "accuracy": accuracy}
    )
    advantages = advantage_fn(total, num_generations=NUM_GENERATIONS, scale="group").tolist()
    for g in range(0, len(advantages), NUM_GENERATIONS):
        assert abs(sum(advantages[g : g + NUM_GENERATIONS])) < 1e-4  # zero mean per group
    out = model.forward_backward(inputs=inputs, advantages=advantages, old_logps=old_logps)
    # The sampler ran the very weights being trained: every ratio is 1, the loss is -mean(A) = 0.
    assert abs(out["loss"]) < 1e-3, out["loss"]
    model.clip_grad_and_step()
    log = metrics.calculate()
    log.update(model.calculate_metric(is_training=True))
    logger.info(f"step {step}: {log}")
    assert "train/completion_length" in log or any("completion" in k for k in log), log
    trained += 1

assert trained == 2
logger.info("GRPO conformance passed")
