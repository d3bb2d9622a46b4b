"""ModelScope Twinkle's sampling calls through ``twinkle_client`` against an in-process server
(mock backend and mock sampler, on a loopback socket): the remote results equal the local
sampler's, with ``new_input_feature`` rebuilt from the caller's own inputs."""

import pytest

from twinkle.sampler import MockSampler  # noqa: E402
from twinkle.server.config import parse_config  # noqa: E402
from twinkle.server.process.local import build_local_server  # noqa: E402
from twinkle.server.state import MemoryStore  # noqa: E402
from twinkle.server.testing import KEYS, config_dict, serve_in_thread
from twinkle_client import init_twinkle_client  # noqa: E402
from twinkle_client.errors import BadRequestError  # noqa: E402

MODEL_ID = "tiny://qwen3"
TRAJ = {
    "messages": [{"role": "user", "content": "Count to three."}],
    "extra": {"answer": "1 2 3"},
}
PARAMS = {"max_tokens": 4, "temperature": 1.0, "seed": 5, "logprobs": 1}


@pytest.fixture(scope="module")
def sampler(tmp_path_factory):
    config = config_dict(MODEL_ID, backend="mock", sampler=True)
    config["applications"][-1]["args"]["sampler_type"] = "mock"
    config["storage"] = {"root": str(tmp_path_factory.mktemp("upstream-sampling") / "storage")}
    server = build_local_server(parse_config(config), store=MemoryStore("t:"))
    with serve_in_thread(server.app) as url:
        client = init_twinkle_client(base_url=url, api_key=KEYS["alice"], timeout=120)
        remote = client.sampler(MODEL_ID)
        remote.set_template("Template", model_id=MODEL_ID)
        yield remote
        client.close()


@pytest.fixture(scope="module")
def local():
    sampler = MockSampler(MODEL_ID)
    sampler.set_template("Template")
    return sampler


def test_remote_samples_equal_local_ones_with_upstream_fields(sampler, local):
    remote = sampler.sample(inputs=[TRAJ] * 2, sampling_params=PARAMS, num_samples=2)
    here = local.sample(inputs=[TRAJ] * 2, sampling_params=PARAMS, num_samples=2)
    assert len(remote.get("sequences", [])) == 4
    for got, want in zip(remote.sequences, here.sequences):
        assert got.tokens == want.tokens and got.text == want.text
        assert [lp[0][1] for lp in got.logprobs] == pytest.approx(
            [lp[0][1] for lp in want.logprobs]
        )
        assert [lp[0][0] for lp in got.logprobs] == got.tokens
        feature, expected = got.new_input_feature, want.new_input_feature
        assert feature["input_ids"].tolist() == expected["input_ids"].tolist()
        assert feature["labels"].tolist() == expected["labels"].tolist()
        assert feature["messages"] == [
            *TRAJ["messages"],
            {"role": "assistant", "content": got.text},
        ]
        assert feature["extra"] == TRAJ["extra"]


def test_add_adapter_to_sampler_names_a_base_model_adapter(sampler):
    from peft import LoraConfig

    sampler.add_adapter_to_sampler("policy", LoraConfig(r=8, lora_alpha=32))
    base = sampler.sample([[7, 8, 9]], PARAMS)
    named = sampler.sample([[7, 8, 9]], PARAMS, adapter_name="policy")
    assert named.sequences[0].tokens == base.sequences[0].tokens
    with pytest.raises(BadRequestError, match="config.r must be an integer >= 1"):
        sampler.add_adapter_to_sampler("broken", {"r": 0})
    with pytest.raises(ValueError, match="num_samples=2 but sampling_params.num_samples=3"):
        sampler.sample([[7, 8, 9]], {**PARAMS, "num_samples": 3}, num_samples=2)
