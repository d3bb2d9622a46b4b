"""The losses ModelScope Twinkle scripts name: values against hand computations, the errors a
user's mistake gets, and the registry's names and aliases."""

import math

import pytest
import torch
import torch.nn.functional as F

from twinkle.errors import ArgumentTypeError, InvalidArgumentError, TwinkleError
from twinkle.loss import (
    BNPOLoss,
    CPOLoss,
    DPOLoss,
    DRGRPOLoss,
    GKDLoss,
    GRPOLoss,
    InfonceLoss,
    LossInputs,
    MSELoss,
    ORPOLoss,
    SAPOLoss,
    SimPOLoss,
    TinkerCrossEntropyLoss,
    get_loss,
)

pytestmark = pytest.mark.unit

# Rows: chosen0, rejected0, chosen1, rejected1; row 2's second token is masked.
LP = [[-1.0, -1.0], [-2.0, -1.0], [-3.0, 0.0], [-1.0, -1.0]]
MASK = [[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0]]
# Sums (-2, -3, -3, -2); means (-1, -1.5, -3, -1).


def _pairs(rows=4, **fields):
    lp = torch.tensor(LP, dtype=torch.float64)[:rows].requires_grad_(True)
    mask = torch.tensor(MASK, dtype=torch.float64)[:rows]
    return lp, LossInputs(
        logprobs=lp, mask=mask, target_tokens=torch.zeros_like(mask, dtype=torch.int64), **fields
    )


def _nls(x):
    return math.log1p(math.exp(-x))


def test_dpo_reference_free_uses_the_policy_alone():
    loss = DPOLoss(beta=0.1, reference_free=True)
    assert loss.needs_reference is False
    assert DPOLoss(reference_free=False).needs_reference is True
    _, inputs = _pairs()  # no ref_logprobs: none is needed
    # logits: 0.1 * ((-2) - (-3)) = 0.1 and 0.1 * ((-3) - (-2)) = -0.1
    assert loss(inputs).loss.item() == pytest.approx((_nls(0.1) + _nls(-0.1)) / 2)


def test_dpo_kto_pair_and_smoothing_only_with_sigmoid():
    ref = torch.zeros(4, 2, dtype=torch.float64)
    _, inputs = _pairs(ref_logprobs=ref)
    out = DPOLoss(beta=0.1, loss_type="kto_pair")(inputs)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    expected = ((1 - sig(-0.2)) + sig(-0.3) + (1 - sig(-0.3)) + sig(-0.2)) / 2
    assert out.loss.item() == pytest.approx(expected)
    with pytest.raises(InvalidArgumentError, match="label_smoothing"):
        DPOLoss(loss_type="ipo", label_smoothing=0.1)


def test_simpo_uses_length_normalised_rewards():
    _, inputs = _pairs()
    out = SimPOLoss(beta=2.0, gamma=0.5)(inputs)
    # pair 0: 2 * (-1 - -1.5) - 0.5 = 0.5; pair 1: 2 * (-3 - -1) - 0.5 = -4.5
    assert out.loss.item() == pytest.approx((_nls(0.5) + _nls(-4.5)) / 2)
    assert out.metrics["reward_accuracy"] == pytest.approx(0.5)


def test_cpo_adds_behaviour_cloning_on_chosen_rows():
    _, inputs = _pairs()
    out = CPOLoss(beta=0.1, bc_coef=2.0)(inputs)
    preference = (_nls(0.1 * 1) + _nls(0.1 * -1)) / 2
    nll = (1 + 1 + 3) / 3  # chosen rows 0 and 2: tokens -1, -1, -3
    assert out.loss.item() == pytest.approx(preference + 2.0 * nll)
    assert out.metrics["nll"] == pytest.approx(nll)


def test_orpo_log_odds_ratio():
    _, inputs = _pairs()
    out = ORPOLoss(lambda_orpo=0.5)(inputs)

    def log_odds(avg):
        return avg - math.log(1 - math.exp(avg))

    ratios = [log_odds(-1.0) - log_odds(-1.5), log_odds(-3.0) - log_odds(-1.0)]
    expected = (1 + 1 + 3) / 3 + 0.5 * sum(_nls(r) for r in ratios) / 2
    assert out.loss.item() == pytest.approx(expected)


@pytest.mark.parametrize("loss", [DPOLoss(reference_free=True), SimPOLoss(), CPOLoss(), ORPOLoss()])
def test_preference_losses_refuse_an_odd_batch(loss):
    _, inputs = _pairs(rows=3)
    with pytest.raises(InvalidArgumentError, match="pairs"):
        loss(inputs)


def _rl(adv, old=None, rows=2):
    lp = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -1.0, -2.0]], dtype=torch.float64)[:rows]
    lp.requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)[:rows]
    return lp, LossInputs(
        logprobs=lp,
        mask=mask,
        target_tokens=torch.zeros_like(mask, dtype=torch.int64),
        advantages=torch.tensor(adv, dtype=torch.float64),
        old_logprobs=old,
    )


def test_sapo_is_the_policy_gradient_on_policy_and_gates_off_policy():
    lp, inputs = _rl([1.0, -2.0])
    out = SAPOLoss()(inputs)
    # r = 1 everywhere: gate = 4 * sigmoid(0) = 2, loss per token = -2 A, per-sequence mean.
    assert out.loss.item() == pytest.approx((-2.0 * 1.0 + -2.0 * -2.0) / 2)
    out.loss.backward()
    # d gate / d lp at r = 1 is 1: gradient -A / (tokens of the row) / rows
    expected = torch.tensor([[-0.25, -0.25, 0.0], [1 / 3, 1 / 3, 1 / 3]], dtype=torch.float64)
    assert torch.allclose(lp.grad, expected)
    # Off policy (r = e) the positive-advantage gate saturates: gradient smaller than A.
    old = torch.tensor([[-2.0, -3.0, -1.5], [-2.5, -2.0, -3.0]], dtype=torch.float64)
    lp2, off = _rl([1.0, 1.0], old=old)
    SAPOLoss(tau_pos=4.0)(off).loss.backward()
    assert 0 < -lp2.grad[0, 0].item() < 0.25


def test_bnpo_and_drgrpo_normalisation():
    _, inputs = _rl([1.0, -2.0])
    # token losses -A (ratio 1): row0 -1, -1; row1 2, 2, 2 -> sum 4
    assert BNPOLoss()(inputs).loss.item() == pytest.approx(4 / 5)
    assert BNPOLoss()(inputs).loss.item() == pytest.approx(
        GRPOLoss(loss_type="bnpo")(inputs).loss.item()
    )
    assert DRGRPOLoss(max_completion_length=10)(inputs).loss.item() == pytest.approx(4 / 20)
    assert DRGRPOLoss(max_completion_length=None)(inputs).loss.item() == pytest.approx(4 / 6)


def test_rl_loss_without_advantages_is_a_user_error_naming_it():
    lp, inputs = _rl([1.0, 1.0])
    inputs.advantages = None
    for loss in (GRPOLoss(), SAPOLoss(), BNPOLoss()):
        with pytest.raises(InvalidArgumentError, match="advantages") as err:
            loss(inputs)
        assert isinstance(err.value, TwinkleError)


def _gkd_inputs(student, teacher):
    mask = torch.ones(student.shape[:2], dtype=torch.float64)
    return LossInputs(
        logprobs=torch.zeros_like(mask),
        mask=mask,
        target_tokens=torch.zeros_like(mask, dtype=torch.int64),
        teacher_topk_logprobs=teacher,
        topk_logits=student,
    )


def test_gkd_divergences():
    g = torch.Generator().manual_seed(0)
    student = torch.randn(2, 3, 5, generator=g, dtype=torch.float64)
    teacher = torch.randn(2, 3, 5, generator=g, dtype=torch.float64)
    s, t = F.log_softmax(student, -1), F.log_softmax(teacher, -1)
    forward = (t.exp() * (t - s)).sum(-1).mean()
    reverse = (s.exp() * (s - t)).sum(-1).mean()
    inputs = _gkd_inputs(student, teacher)
    assert GKDLoss(beta=0.0)(inputs).loss.item() == pytest.approx(forward.item())
    assert GKDLoss(beta=1.0)(inputs).loss.item() == pytest.approx(reverse.item())
    m = torch.log(0.5 * s.exp() + 0.5 * t.exp())
    jsd = 0.5 * (t.exp() * (t - m)).sum(-1) + 0.5 * (s.exp() * (s - m)).sum(-1)
    assert GKDLoss(beta=0.5)(inputs).loss.item() == pytest.approx(jsd.mean().item())
    # Teacher log-probs and logits of the same distribution are the same teacher.
    assert GKDLoss()(_gkd_inputs(student, F.log_softmax(student, -1))).loss.item() == (
        pytest.approx(0.0, abs=1e-6)
    )
    with pytest.raises(InvalidArgumentError, match="teacher_topk_logprobs"):
        GKDLoss()(_gkd_inputs(student, None))
    with pytest.raises(InvalidArgumentError, match="beta"):
        GKDLoss(beta=1.5)


def test_mse_regresses_logprobs_onto_target_values():
    lp, inputs = _pairs()
    inputs.target_values = torch.full((4, 2), -1.0, dtype=torch.float64)
    # squared errors on the 7 trained tokens: 0,0, 1,0, 4, 0,0
    assert MSELoss()(inputs).loss.item() == pytest.approx(5 / 7)
    inputs.target_values = None
    with pytest.raises(InvalidArgumentError, match="target_values"):
        MSELoss()(inputs)


def _emb_inputs(embeddings, labels):
    rows = len(labels)
    mask = torch.zeros(rows, 1)
    return LossInputs(
        logprobs=torch.zeros(rows, 1),
        mask=mask,
        target_tokens=torch.full((rows, 1), -100),
        embeddings=torch.tensor(embeddings, dtype=torch.float64),
        row_labels=torch.tensor(labels),
    )


def test_infonce_in_group_and_in_batch():
    # Two groups [anchor, positive, negative]; unit vectors, so cosine = dot product.
    e = [[1, 0], [0.6, 0.8], [0, 1], [0, 1], [0.8, 0.6], [1, 0]]
    inputs = _emb_inputs(e, [1, 0, 0, 1, 0, 0])
    own = InfonceLoss(temperature=0.5, use_batch=False)(inputs)
    ce0 = -math.log(math.exp(0.6 / 0.5) / (math.exp(0.6 / 0.5) + math.exp(0.0)))
    ce1 = -math.log(math.exp(0.6 / 0.5) / (math.exp(0.6 / 0.5) + math.exp(0.0)))
    assert own.loss.item() == pytest.approx((ce0 + ce1) / 2)
    assert own.metrics["pos_sim"] == pytest.approx(0.6)
    assert own.metrics["neg_sim"] == pytest.approx(0.0)
    batch = InfonceLoss(temperature=0.5, use_batch=True)(inputs)
    # anchor 0 against docs [0.6,0.8],[0,1],[0.8,0.6],[1,0]: sims 0.6, 0, 0.8, 1 (target 0)
    row0 = [0.6, 0.0, 0.8, 1.0]
    row1 = [0.8, 1.0, 0.6, 0.0]  # anchor [0,1]: target index 2
    ce = -math.log(math.exp(row0[0] / 0.5) / sum(math.exp(x / 0.5) for x in row0))
    ce += -math.log(math.exp(row1[2] / 0.5) / sum(math.exp(x / 0.5) for x in row1))
    assert batch.loss.item() == pytest.approx(ce / 2)


def test_infonce_hard_negatives_and_label_errors():
    e = [[1, 0], [0.6, 0.8], [1, 0], [0.6, 0.8]]
    trimmed = InfonceLoss(temperature=1.0, use_batch=False, hard_negatives=0)
    # Only the positive is left in each group: cross entropy over one candidate is 0.
    assert trimmed(_emb_inputs(e, [1, 0, 1, 0])).loss.item() == pytest.approx(0.0)
    with pytest.raises(InvalidArgumentError, match="anchor"):
        InfonceLoss()(_emb_inputs(e, [0, 1, 0, 1]))
    with pytest.raises(InvalidArgumentError, match="no positive"):
        InfonceLoss()(_emb_inputs(e, [1, 0, 0, 1]))
    with pytest.raises(InvalidArgumentError, match="no negative"):
        InfonceLoss(hard_negatives=2)(_emb_inputs(e, [1, 0, 1, 0]))


def test_registry_names_aliases_and_argument_errors():
    assert type(get_loss("grpo")) is GRPOLoss
    assert type(get_loss("sapo")) is SAPOLoss and get_loss("sapo").name == "SAPOLoss"
    assert type(get_loss("dr_grpo")) is DRGRPOLoss
    assert type(get_loss("InfoNCELoss")) is InfonceLoss
    # Tinker's names keep their meaning.
    assert type(get_loss("cross_entropy")) is TinkerCrossEntropyLoss
    with pytest.raises(ArgumentTypeError, match="reference_fre.*accepts: .*reference_free"):
        get_loss("DPOLoss", reference_fre=True)
    with pytest.raises(InvalidArgumentError, match="loss_type"):
        get_loss("GRPOLoss", loss_type="nope")
