"""Update functions go to the Ray store actor by pickle: the state they capture must pickle."""

import pytest

from twinkle.server.state import ServerState

pytestmark = pytest.mark.unit


class PicklableStore:
    """Stands in for the Ray store's handle (picklable, unlike the in-process stores' locks)."""


def test_a_state_with_unflushed_usage_pickles_without_its_buffer():
    import ray.cloudpickle as cloudpickle

    state = ServerState(PicklableStore())
    lock, pending = state._usage_buffer()
    pending[("owner", 1, "train", "m", "s")] = 5
    copy = cloudpickle.loads(cloudpickle.dumps(state))
    assert "_usage_pending" not in copy.__dict__  # the counts stay with the process that has them
    assert state._usage_buffer()[1] == {("owner", 1, "train", "m", "s"): 5}
