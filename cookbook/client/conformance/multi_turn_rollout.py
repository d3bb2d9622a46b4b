# A multi-turn rollout through the Twinkle client, in ModelScope Twinkle's style: each trajectory
# has its own environment behind an EnvTool and a ToolManager; ClientMultiTurnRollout samples on
# the server, runs tool calls and trains only the model's own tokens with GRPO.
import os

from peft import LoraConfig

from twinkle import get_logger, init_twinkle_client
from twinkle.advantage import GRPOAdvantage
from twinkle.data_format import SamplingParams
from twinkle.template import Qwen3_5Template
from twinkle_agentic.envs import Env, EnvTool, StepResult
from twinkle_agentic.tools.tool_manager import ToolManager
from twinkle_client.model import MultiLoraTransformersModel
from twinkle_client.rollout import ClientMultiTurnRollout
from twinkle_client.sampler import vLLMSampler

logger = get_logger()
MODEL_ID = f"ms://{os.environ.get('TWINKLE_MODEL_ID', 'Qwen/Qwen3.5-4B')}"
NUM_GENERATIONS, BATCH_SIZE = 2, 2
GUESS = {"type": "object", "properties": {"number": {"type": "integer"}}, "required": ["number"]}


class GuessTheNumber(Env):
    """Guess a number from 1 to 10: reward 1 for a hit, 0 after three misses."""

    def __init__(self, secret: int):
        self.secret, self.tries = secret, 0

    def reset(self):
        return StepResult(observation="I picked a number from 1 to 10. Call guess(number=...).")

    def step(self, tool_name, arguments):
        self.tries += 1
        if int(arguments.get("number", 0)) == self.secret:
            return StepResult(observation="Right!", reward=1.0, done=True)
        return StepResult(observation="Wrong.", done=self.tries >= 3)


init_twinkle_client(
    base_url=os.environ.get("TWINKLE_SERVER_URL", "http://localhost:8000"),
    api_key=os.environ.get("TWINKLE_SERVER_TOKEN", "EMPTY_TOKEN"),
)
model = MultiLoraTransformersModel(model_id=MODEL_ID)
model.add_adapter_to_model("default", LoraConfig(target_modules="all-linear", r=8, lora_alpha=16))
model.set_loss("GRPOLoss", epsilon=0.2)
model.set_optimizer("Adam", lr=1e-4)
model.set_processor("InputProcessor")
model.set_template("Qwen3_5Template", model_id=MODEL_ID, enable_thinking=False)
sampler = vLLMSampler(model_id=MODEL_ID)
sampler.set_template("Qwen3_5Template", model_id=MODEL_ID, enable_thinking=False)
rollout = ClientMultiTurnRollout(
    sampler=sampler,
    template=Qwen3_5Template(model_id=MODEL_ID, max_length=1024, enable_thinking=False),
    sampling_params=SamplingParams(max_tokens=24, num_samples=1, logprobs=1, temperature=1.0),
    max_turns=3,
)

trajectories, managers, tools = [], [], []
for i in range(BATCH_SIZE * NUM_GENERATIONS):
    env = GuessTheNumber(secret=1 + i % 10)
    tool = EnvTool(env=env, tool_name="guess", description="Guess the number.", parameters=GUESS)
    manager = ToolManager([tool])
    trajectories.append(
        {
            "messages": [{"role": "user", "content": env.reset().observation}],
            "tools": manager.tool_infos(),
        }
    )
    managers.append(manager)
    tools.append(tool)
assert trajectories[0]["tools"][0]["function"]["name"] == "guess"

rolled = rollout(trajectories, tool_manager=managers)
inputs, old_logps = [], []
for trajectory in rolled:
    assert 1 <= trajectory.get("turns") <= 3
    labels, ids = list(trajectory["labels"]), list(trajectory["input_ids"])
    trained = [t for t, label in zip(ids, labels) if label != -100]
    assert trained and labels[0] == -100  # the prompt is never trained
    pairs = trajectory.get("logprobs")
    assert [lp[0][0] for lp in pairs] == trained  # one (token, logprob) pair per trained token
    inputs.append(trajectory)
    old_logps.append([lp[0][1] for lp in pairs])
# A tiny random model rarely calls the tool: the episode's reward, plus a little for confident
# replies (their mean log-prob), so that the group has something to compare.
rewards = [t.episode_reward + 0.01 * sum(o) / len(o) for t, o in zip(tools, old_logps)]
advantages = GRPOAdvantage()(rewards, num_generations=NUM_GENERATIONS, scale="group").tolist()
assert any(abs(a) > 1e-6 for a in advantages), advantages
out = model.forward_backward(inputs=inputs, advantages=advantages, old_logps=old_logps)
# Sampled with the weights being trained: every ratio is 1, so the loss is -mean(A) = 0.
assert abs(out["loss"]) < 1e-3, out["loss"]
model.clip_grad_and_step()
assert model.calculate_metric(is_training=True).result["grad_norm"] > 0
logger.info(
    f"rollout: turns={[t.get('turns') for t in rolled]} rewards={rewards} loss={out['loss']:.4f}"
)
logger.info("multi-turn rollout conformance passed")
