"""Wire types: Message, Trajectory, InputFeature."""

import numpy as np
import pydantic
import pytest

import twinkle.data_format as local
import twinkle_client.data_format as client
from twinkle.data_format import InputFeature, Message, Trajectory


def test_local_reexports_client_types():
    assert local.__all__ == client.__all__
    for name in client.__all__:
        assert getattr(local, name) is getattr(client, name)


def test_message_roles_are_checked():
    assert Message(role="tool", content="42").reasoning_content is None
    with pytest.raises(pydantic.ValidationError):
        Message(role="robot", content="hi")


def test_trajectory_extra_defaults_to_a_fresh_dict():
    a = Trajectory(messages=[Message(role="user", content="hi")])
    b = Trajectory(messages=[])
    a.extra["answer"] = "4"
    assert b.extra == {}


def test_trajectory_coerce_accepts_dicts():
    traj = Trajectory.coerce({"messages": [{"role": "user", "content": "hi"}], "extra": {"x": 1}})
    assert traj.messages[0] == Message(role="user", content="hi")
    assert traj.extra == {"x": 1}
    with pytest.raises(TypeError):
        Trajectory.coerce(["not", "a", "trajectory"])


def test_input_feature_holds_int64_arrays():
    f = InputFeature(input_ids=[5, 6, 7], labels=[-100, 6, 7], advantages=[0.0, 1.0, 1.0], tag="a")
    assert isinstance(f, dict)
    assert f["input_ids"].dtype == np.int64 and f["labels"].dtype == np.int64
    assert f["input_ids"].tolist() == [5, 6, 7]
    assert f["length"] == 3
    assert f["advantages"].tolist() == [0.0, 1.0, 1.0]
    assert f["tag"] == "a"


def test_input_feature_defaults_labels_to_ignore():
    assert InputFeature({"input_ids": [1, 2]})["labels"].tolist() == [-100, -100]


def test_input_feature_rejects_mismatched_labels():
    with pytest.raises(ValueError, match="labels has 1 tokens but input_ids has 2"):
        InputFeature(input_ids=[1, 2], labels=[1])
    with pytest.raises(ValueError, match="input_ids"):
        InputFeature(labels=[1])


def test_input_feature_round_trips_through_pydantic_json():
    class Batch(pydantic.BaseModel):
        features: list[InputFeature]

    batch = Batch(features=[{"input_ids": [1, 2], "labels": [-100, 2]}])
    assert isinstance(batch.features[0], InputFeature)
    again = Batch.model_validate_json(batch.model_dump_json())
    assert again.features[0]["labels"].tolist() == [-100, 2]
    assert again.features[0]["length"] == 2
