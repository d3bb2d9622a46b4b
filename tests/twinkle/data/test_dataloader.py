"""DataLoader: batches, epochs, seeded shuffle and exact resume."""

import pytest

from twinkle.dataloader import DataLoader


def flat(batches):
    return [x for batch in batches for x in batch]


def test_batches_and_len():
    loader = DataLoader(list(range(10)), batch_size=4)
    assert len(loader) == 3
    assert list(loader) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    dropping = DataLoader(list(range(10)), batch_size=4, drop_last=True)
    assert len(dropping) == 2
    assert flat(dropping) == list(range(8))


def test_each_iter_is_a_new_epoch_with_its_own_seeded_order():
    data = list(range(20))
    loader = DataLoader(data, batch_size=6, shuffle=True, seed=7)
    epoch0, epoch1 = flat(loader), flat(loader)
    assert sorted(epoch0) == data and sorted(epoch1) == data
    assert epoch0 != epoch1
    again = DataLoader(data, batch_size=6, shuffle=True, seed=7)
    assert flat(again) == epoch0 and flat(again) == epoch1
    assert loader.get_state() == {"consumed_train_samples": 40, "epoch": 2, "seed": 7}


def run(loader, batches):
    """Take ``batches`` batches, crossing epochs like a training loop would."""
    seen = []
    while len(seen) < batches:
        for batch in loader:
            seen.append(batch)
            if len(seen) == batches:
                break
    return seen


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("stop_after", [1, 3, 4, 5, 9])
def test_resume_yields_exactly_the_unseen_samples(stop_after, drop_last):
    data = list(range(22))
    reference = DataLoader(data, batch_size=5, shuffle=True, seed=3, drop_last=drop_last)
    full = run(reference, 12)
    first = DataLoader(data, batch_size=5, shuffle=True, seed=3, drop_last=drop_last)
    done = run(first, stop_after)
    assert done == full[:stop_after]
    state = first.get_state()
    assert state["consumed_train_samples"] == len(flat(done))

    resumed = DataLoader(data, batch_size=5, shuffle=True, seed=3, drop_last=drop_last)
    resumed.resume_from_checkpoint(state["consumed_train_samples"])
    assert resumed.get_state() == state
    assert run(resumed, 12 - stop_after) == full[stop_after:]


def test_resume_across_an_epoch_boundary_finishes_that_epoch_first():
    data = list(range(10))
    loader = DataLoader(data, batch_size=4, shuffle=True, seed=0)
    epoch0, epoch1 = flat(loader), flat(loader)
    resumed = DataLoader(data, batch_size=4, shuffle=True, seed=0)
    resumed.resume_from_checkpoint(14)  # all of epoch 0 and 4 samples of epoch 1
    assert resumed.get_state()["epoch"] == 1
    rest = flat(resumed)
    assert rest == epoch1[4:]
    assert sorted(epoch1[:4] + rest) == data and epoch0 != epoch1
    assert resumed.get_state() == {"consumed_train_samples": 20, "epoch": 2, "seed": 0}


def test_breaking_out_continues_the_same_epoch():
    loader = DataLoader(list(range(6)), batch_size=2)
    for batch in loader:
        assert batch == [0, 1]
        break
    assert list(loader) == [[2, 3], [4, 5]]
    assert list(loader) == [[0, 1], [2, 3], [4, 5]]


def test_works_with_a_dataset(tokenizer):
    from twinkle.dataset import Dataset, DatasetMeta
    from twinkle.template import Qwen3_5Template

    ds = Dataset(DatasetMeta("builtin://self-cognition", data_slice=range(10)))
    ds.map("SelfCognitionProcessor", init_args={"model_name": "A", "model_author": "B"})
    ds.set_template(Qwen3_5Template(tokenizer=tokenizer)).encode()
    batches = list(DataLoader(ds, batch_size=4))
    assert [len(b) for b in batches] == [4, 4, 2]
    assert batches[0][1]["input_ids"].tolist() == ds[1]["input_ids"].tolist()


def test_bad_arguments():
    with pytest.raises(ValueError):
        DataLoader([1], batch_size=0)
    with pytest.raises(ValueError):
        DataLoader([1], batch_size=1).resume_from_checkpoint(-1)
    empty = DataLoader([], batch_size=2, shuffle=True)
    assert len(empty) == 0 and list(empty) == []
