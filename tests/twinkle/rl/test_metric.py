"""twinkle.metric against hand computations; registry and the model-side fold."""

import math

import numpy as np
import pytest
import torch

from twinkle.errors import ArgumentTypeError, InvalidArgumentError
from twinkle.metric import (
    Accuracy,
    CompletionRewardMetric,
    DPOMetric,
    EmbeddingMetric,
    GRPOMetric,
    LossMetric,
    MetricInputs,
    TrainMetric,
    get_metric,
    known_metrics,
)
from twinkle.model.metrics import AttachedMetrics, Metric
from twinkle_client.model.metrics import Metric as ClientMetric

# Rows: chosen, rejected, chosen, rejected. Sequence log-probs -3, -4, -2, -6.
LOGPROBS = [[-1.0, -2.0, 0.0], [-3.0, -1.0, 0.0], [-0.5, -0.5, -1.0], [-2.0, -2.0, -2.0]]
MASK = [[1, 1, 0], [1, 1, 0], [1, 1, 1], [1, 1, 1]]
# Reference sequence log-probs -3.5, -3, -2.5, -7 (the -100s sit where the mask is 0).
REF = [[-1.5, -2.0, -100.0], [-1.5, -1.5, -100.0], [-1.0, -1.0, -0.5], [-2.0, -2.0, -3.0]]


def test_dpo_metric_hand_computed():
    metric = DPOMetric(beta=0.1)
    metric.update(MetricInputs.from_outputs(logprobs=LOGPROBS, mask=MASK, ref_logprobs=REF))
    got = metric.calculate()
    # chosen rewards 0.1*(-3+3.5)=0.05, 0.1*(-2+2.5)=0.05; rejected 0.1*(-4+3)=-0.1,
    # 0.1*(-6+7)=0.1; margins 0.15, -0.05
    expected = {
        "logps/chosen": -2.5,
        "logps/rejected": -5.0,
        "logps/ref_chosen": -3.0,
        "logps/ref_rejected": -5.0,
        "rewards/chosen": 0.05,
        "rewards/rejected": 0.0,
        "rewards/margins": 0.05,
        "rewards/accuracies": 0.5,
    }
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-12), key
    metric.reset()
    assert metric.calculate() == {}


def test_dpo_metric_agrees_with_dpo_loss():
    from twinkle.loss import DPOLoss, LossInputs

    out = DPOLoss(beta=0.1)(
        LossInputs(
            logprobs=torch.tensor(LOGPROBS),
            mask=torch.tensor(MASK, dtype=torch.float32),
            target_tokens=torch.zeros(4, 3, dtype=torch.long),
            ref_logprobs=torch.tensor(REF),
        )
    )
    metric = DPOMetric(beta=0.1)
    metric.update(MetricInputs.from_outputs(logprobs=LOGPROBS, mask=MASK, ref_logprobs=REF))
    got = metric.calculate()
    assert got["rewards/accuracies"] == pytest.approx(out.metrics["reward_accuracy"])
    assert got["rewards/margins"] == pytest.approx(out.metrics["reward_margin"], abs=1e-6)


def test_dpo_metric_without_reference_and_odd_batch():
    metric = DPOMetric()
    metric.update(MetricInputs.from_outputs(logprobs=LOGPROBS[:2], mask=MASK[:2]))
    assert metric.calculate() == {"logps/chosen": -3.0, "logps/rejected": -4.0}
    with pytest.raises(InvalidArgumentError, match="odd batch of 3"):
        metric.update(MetricInputs.from_outputs(logprobs=LOGPROBS[:3], mask=MASK[:3]))


def test_grpo_metric_hand_computed():
    # row 0: d = new - old = [0.5, 0], advantage +1; row 1: d = -0.5 on its one token, adv -1.
    # The 50.0 sits where the mask is 0 and must not count.
    metric = GRPOMetric(epsilon=0.2)
    metric.update(
        MetricInputs.from_outputs(
            logprobs=[[-1.0, -2.0], [-3.0, 0.0]],
            old_logprobs=[[-1.5, -2.0], [-2.5, 50.0]],
            mask=[[1, 1], [1, 0]],
            advantages=[1.0, -1.0],
        )
    )
    got = metric.calculate()
    kl = [math.exp(0.5) - 1.5, 0.0, math.exp(-0.5) - 0.5]
    expected = {
        "train/mean_new_logp": -2.0,
        "train/policy_confidence": math.exp(-2.0),
        "train/mean_old_logp": -6.0 / 3,
        "train/logp_diff_mean": 0.0,
        "train/approx_kl": sum(kl) / 3,
        "train/token_kl_max": kl[0],
        "train/token_ratio_max": math.exp(0.5),
        "train/clip_ratio_low": 1 / 3,
        "train/clip_ratio_high": 1 / 3,
        "train/clip_ratio": 2 / 3,
    }
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_grpo_metric_without_old_logprobs_and_per_token_advantages():
    metric = GRPOMetric(epsilon=0.2, epsilon_high=0.1)
    metric.update(MetricInputs.from_outputs(logprobs=[[-1.0, -3.0]], mask=[[1, 1]]))
    assert metric.calculate() == {
        "train/mean_new_logp": -2.0,
        "train/policy_confidence": pytest.approx(math.exp(-2.0)),
    }
    metric.reset()
    # ratio 1.15 on token 0 clips with epsilon_high 0.1 (its advantage is +), token 1 does not
    metric.update(
        MetricInputs.from_outputs(
            logprobs=[[math.log(1.15), 0.0]],
            old_logprobs=[[0.0, 0.0]],
            mask=[[1, 1]],
            advantages=[[1.0, -1.0]],
            entropies=[[0.5, 1.5]],
        )
    )
    got = metric.calculate()
    assert got["train/clip_ratio_high"] == 0.5 and got["train/clip_ratio_low"] == 0.0
    assert got["train/entropy"] == 1.0


def test_embedding_metric_hand_computed():
    emb = [[1.0, 0.0], [2.0, 0.0], [0.0, 1.0], [1.0, 1.0]]  # a0, p0, a1, p1
    metric = EmbeddingMetric()
    metric.update(MetricInputs.from_outputs(embeddings=emb, loss=0.5))
    metric.update(MetricInputs.from_outputs(loss=1.5))
    got = metric.calculate()
    s = 2**-0.5
    assert got == pytest.approx(
        {
            "pos_sim": (1 + s) / 2,
            "pos_sim_min": s,
            "pos_sim_max": 1.0,
            "neg_sim": (s + 0.0) / 2,
            "loss": 1.0,
        }
    )
    # labels: the anchor is row 1, its positive row 2
    metric.reset()
    metric.update(
        MetricInputs.from_outputs(
            embeddings=[[5.0, 5.0], [0, 1], [0, 3]], embedding_labels=[0, 1, 0]
        )
    )
    assert metric.calculate() == pytest.approx(
        {"pos_sim": 1.0, "pos_sim_min": 1.0, "pos_sim_max": 1.0}
    )
    with pytest.raises(InvalidArgumentError, match="no positive"):
        metric.update(
            MetricInputs.from_outputs(embeddings=[[1, 0], [0, 1]], embedding_labels=[0, 1])
        )


def test_completion_reward_metric_as_upstream_scripts_call_it():
    metric = CompletionRewardMetric()
    metric.accumulate(
        None,
        None,
        completion_lengths=[10, 20],
        rewards={"total": [1.0, 0.0], "format": [1.0, 1.0]},
    )
    metric.accumulate(rewards={"total": np.array([2.0], dtype=np.float32)}, completion_lengths=[30])
    metric.accumulate(generate_time=1.0)
    metric.accumulate(generate_time=2.0, weight_sync_time=0.5)
    assert metric.calculate() == {
        "train/total_reward": 1.0,
        "train/total_reward_std": 1.0,
        "train/format_reward": 1.0,
        "train/format_reward_std": 0.0,
        "train/completion_length": 20.0,
        "profiling/Time taken: generate": 1.5,
        "profiling/Time taken: move_model_to_sampler": 0.5,
    }
    metric.reset()
    assert metric.calculate() == {}
    with pytest.raises(TypeError):
        metric.accumulate(rewardz={"total": [1.0]})


def test_loss_accuracy_and_train_metrics():
    loss, acc = LossMetric(), Accuracy()
    for value, correct in ((1.0, 3), (2.0, 1)):
        batch = MetricInputs.from_outputs(loss=value, correct=correct, mask=[[1, 1, 0], [1, 1, 1]])
        loss.update(batch)
        acc.update(batch)
    assert loss.calculate() == {"loss": 1.5}
    assert acc.calculate() == {"accuracy": 0.4, "correct_tokens": 4.0, "total_tokens": 10.0}
    now = [100.0]
    train = TrainMetric(clock=lambda: now[0])
    now[0] = 102.0
    train.update(MetricInputs.from_outputs(mask=[[1, 1], [1, 0]], lr=1e-4, step=3))
    now[0] = 104.0
    assert train.calculate() == {
        "elapsed_seconds": 4.0,
        "learning_rate": 1e-4,
        "iters": 3.0,
        "samples_per_second": 0.5,
        "tokens_per_second": 0.75,
    }
    train.reset()
    now[0] = 105.0
    assert train.calculate()["samples_per_second"] == 0.0


def test_registry():
    assert known_metrics() == [
        "Accuracy",
        "DPOMetric",
        "EmbeddingMetric",
        "GRPOMetric",
        "LossMetric",
        "TrainMetric",
    ]
    assert get_metric("DPOMetric", beta=0.5).beta == 0.5
    assert isinstance(get_metric(GRPOMetric, epsilon=0.3), GRPOMetric)
    with pytest.raises(
        InvalidArgumentError, match="unknown metric 'Nope'; known metrics: Accuracy"
    ):
        get_metric("Nope")
    with pytest.raises(InvalidArgumentError, match="training script"):
        get_metric("CompletionRewardMetric")
    with pytest.raises(InvalidArgumentError, match="DPOMetric.*bogus"):
        get_metric("DPOMetric", bogus=1)
    with pytest.raises(ArgumentTypeError):
        get_metric(3)
    with pytest.raises(ArgumentTypeError, match="no fields"):
        MetricInputs.from_outputs(logps=[[0.0]])
    with pytest.raises(ArgumentTypeError, match="MetricInputs"):
        DPOMetric().accumulate({"labels": [1]}, {"logps": [[0.0]]})


def test_attached_metrics_fold_and_reset():
    attached = AttachedMetrics()
    attached.add("DPOMetric", beta=0.1)  # training and evaluation, one instance each
    attached.add("LossMetric", is_training=False)
    assert [type(m).__name__ for m in attached.train] == ["DPOMetric"]
    assert [type(m).__name__ for m in attached.eval] == ["DPOMetric", "LossMetric"]
    assert attached.train[0] is not attached.eval[0]
    assert attached.specs[0] == {"name": "DPOMetric", "is_training": None, "beta": 0.1}
    lp = torch.tensor(LOGPROBS, requires_grad=True)
    attached.update(
        True, logprobs=lp, mask=torch.tensor(MASK), ref_logprobs=torch.tensor(REF), loss=0.7
    )
    assert attached.wants(True) and attached.wants(False)
    train = attached.report(True)
    assert train["rewards/accuracies"] == 0.5 and train["logps/chosen"] == -2.5
    assert attached.report(True) == {}  # reported metrics start over
    assert attached.report(False) == {}
    attached.update(False, logprobs=LOGPROBS[:2], mask=MASK[:2], loss=0.25)
    assert attached.report(False) == {"logps/chosen": -3.0, "logps/rejected": -4.0, "loss": 0.25}
    with pytest.raises(ArgumentTypeError, match="is_training"):
        attached.add("LossMetric", is_training="yes")
    with pytest.raises(InvalidArgumentError, match="unknown metric"):
        attached.add("Nope")
    empty = AttachedMetrics()
    empty.update(True, logprobs=object())  # nothing attached: the inputs are not even read
    assert not empty.wants(True)


@pytest.mark.parametrize("cls", [Metric, ClientMetric])
def test_metric_snapshot_reads_like_its_dict(cls):
    snapshot = cls(result={"loss": 1.5, "step": 2})
    log = {"train/frac_reward_zero_std": 0.0}
    log.update(snapshot)  # upstream's grpo.py: log_dict.update(model.calculate_metric())
    assert log == {"train/frac_reward_zero_std": 0.0, "loss": 1.5, "step": 2}
    assert snapshot["loss"] == 1.5 and len(snapshot) == 2 and dict(snapshot) == snapshot.result
    assert snapshot == {"loss": 1.5, "step": 2} and snapshot == cls(result=dict(snapshot))
    assert repr(snapshot) == "Metric({'loss': 1.5, 'step': 2})"


def test_record_attached_metrics_reads_a_real_forward_state():
    from types import SimpleNamespace

    from twinkle.loss import LossOutput
    from twinkle.model.metrics import record_attached_metrics
    from twinkle.model.step.batch import TenantBatch
    from twinkle.model.step.passes import ForwardState

    mask = torch.tensor(MASK, dtype=torch.float32)
    batch = TenantBatch(
        tenant="t",
        tensors={},
        targets=torch.zeros(4, 3, dtype=torch.long),
        mask=mask,
        extras={"advantages": None, "old_logprobs": None, "ref_logprobs": None, "weights": None},
        alignment="shifted",
        num_samples=4,
    )
    state = ForwardState(batch=batch, logprobs=torch.tensor(LOGPROBS), correct=5)
    state.ref_logprobs = torch.tensor(REF)  # the step's own reference pass
    state.loss_output = LossOutput(loss=torch.tensor(0.3), num_tokens=10, metrics={"loss": 0.3})
    tenant = SimpleNamespace(attached_metrics=AttachedMetrics(), lr=lambda: 1e-3, cur_step=7)
    for name in ("DPOMetric", "Accuracy", "LossMetric", "TrainMetric"):
        tenant.attached_metrics.add(name, is_training=True)
    record_attached_metrics(tenant, state, is_training=True)
    record_attached_metrics(tenant, state, is_training=False)  # nothing attached for eval
    got = tenant.attached_metrics.report(True)
    assert got["rewards/accuracies"] == 0.5 and got["accuracy"] == 0.5
    assert got["loss"] == pytest.approx(0.3) and got["learning_rate"] == 1e-3
    assert got["iters"] == 7.0
    assert tenant.attached_metrics.report(False) == {}
    record_attached_metrics(SimpleNamespace(), state, is_training=True)  # no field: no-op
