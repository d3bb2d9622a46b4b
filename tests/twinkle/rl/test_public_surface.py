"""The public names of twinkle.advantage, twinkle.reward and twinkle.metric (upstream's included)."""

import twinkle.advantage
import twinkle.metric
import twinkle.reward


def test_public_surface():
    assert twinkle.advantage.__all__ == [
        "Advantage",
        "GAEAdvantage",
        "GRPOAdvantage",
        "RLOOAdvantage",
    ]
    assert set(twinkle.reward.__all__) >= {
        "Reward",
        "FormatReward",
        "MathReward",
        "CountDownAccuracy",
        "GSM8KAccuracyReward",
        "GSM8KFormatReward",
    }
    assert set(twinkle.metric.__all__) >= {
        "Metric",
        "Accuracy",
        "LossMetric",
        "TrainMetric",
        "DPOMetric",
        "GRPOMetric",
        "CompletionRewardMetric",
        "EmbeddingMetric",
        "get_metric",
    }
    for module in (twinkle.advantage, twinkle.reward, twinkle.metric):
        assert all(hasattr(module, name) for name in module.__all__)
