"""The history's points and bound: what a step's figures become, and how old points are thinned."""

import math

import pytest

from twinkle_client.tracking.history import (
    HistoryPoint,
    PointLog,
    StepAccumulator,
    TrainingHistoryRecorder,
)


def test_a_step_averages_its_forward_backwards_and_sums_their_tokens():
    acc = StepAccumulator()
    acc.add(2.0, 10, {"kl": 0.5, "loss": 9.0})
    acc.add(1.0, 6, {"kl": 1.5})
    acc.add(float("nan"), 4, {"kl": float("inf")})  # not finite: skipped, its tokens count
    point = acc.close(7, learning_rate=1e-3, grad_norm=0.25, now=100.0)
    assert (point.step, point.time, point.loss, point.num_tokens) == (7, 100.0, 1.5, 20)
    assert (point.learning_rate, point.grad_norm, point.micro_batches) == (1e-3, 0.25, 3)
    assert point.metrics == {"kl": 1.0}
    assert point.step_time_s is None
    following = acc.close(8, now=103.5)
    assert (following.loss, following.num_tokens, following.step_time_s) == (None, 0, 3.5)
    assert acc.last_step == 8


def test_scalars_are_flat_finite_numbers_for_trackers():
    point = HistoryPoint(step=3, time=1.0, loss=0.5, num_tokens=8, metrics={"kl": 0.1})
    assert point.scalars() == {"loss": 0.5, "num_tokens": 8.0, "metrics/kl": 0.1}


def test_the_log_stays_bounded_newest_points_kept_and_older_ones_thinned():
    log = PointLog(max_points=40, block_points=10)
    for step in range(1, 101):
        log.append(HistoryPoint(step=step, time=float(step)))
    history = log.history("run")
    steps = [p.step for p in history.points]
    assert len(steps) <= 40 and history.recorded == 100 and history.thinned
    assert steps == sorted(steps) and steps[0] == 1
    assert steps[-10:] == list(range(91, 101))  # the newest block at full resolution
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    assert max(gaps[:5]) > 1 and gaps[-9:] == [1] * 9


def test_since_step_returns_only_newer_points():
    log = PointLog(max_points=40, block_points=10)
    for step in range(1, 26):
        log.append(HistoryPoint(step=step, time=0.0))
    assert [p.step for p in log.history("r", since_step=22).points] == [23, 24, 25]
    assert log.history("r", since_step=25).points == []


def test_a_bound_smaller_than_two_blocks_is_refused():
    with pytest.raises(ValueError, match="two blocks"):
        PointLog(max_points=10, block_points=10)


def test_the_recorder_closes_a_point_per_step():
    recorder = TrainingHistoryRecorder()
    recorder.forward_backward(3.0, 5)
    recorder.stepped(1, 0.1, 2.0)
    recorder.forward_backward(1.0, 5)
    recorder.stepped(2, 0.1, math.nan)
    history = recorder.history("a")
    assert history.series("loss") == [(1, 3.0), (2, 1.0)]
    assert history.series("grad_norm") == [(1, 2.0)]
