"""One trajectory's running state in a multi-turn rollout: its tokens, labels and log-probs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from twinkle_client.data_format._input_feature import IGNORE_INDEX
from twinkle_client.rollout._result import RolloutTrajectory
from twinkle_client.sampler.types import TokenLogprob


@dataclass
class Episode:
    """The token stream of one trajectory as the rollout grows it.

    ``input_ids`` is the whole conversation as the model read and wrote it: the prompt, each
    sampled completion and, between completions, the tool results and the next generation
    prompt (the "bridge"). Only sampled tokens carry a label (the token itself); every other
    position is ``-100``. ``logprobs`` holds one :class:`TokenLogprob` per sampled token, in
    order, so its length always equals the number of labelled positions.
    """

    source: Mapping[str, Any]
    messages: list[dict[str, Any]]
    tools: list[Any]
    input_ids: list[int] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    missing_logprobs: bool = False
    turns: int = 0
    stop_reason: str | None = None
    truncated: bool = False
    done: bool = False

    def add_context(self, token_ids: Sequence[int]) -> None:
        """Tokens the model reads but is not trained on (prompt, tool results)."""
        self.input_ids += [int(t) for t in token_ids]
        self.labels += [IGNORE_INDEX] * len(token_ids)

    def add_sampled(self, tokens: Sequence[int], logprobs: Sequence[float]) -> None:
        """A completion: trained tokens, with the sampler's log-prob of each.

        Raises:
            RuntimeError: The sampler returned log-probs, but not one per token.
        """
        tokens = [int(t) for t in tokens]
        if logprobs and len(logprobs) != len(tokens):
            raise RuntimeError(
                f"the sampler returned {len(logprobs)} logprobs for {len(tokens)} tokens"
            )
        if not logprobs and tokens:
            self.missing_logprobs = True
        self.input_ids += tokens
        self.labels += tokens
        self.logprobs += [_pairs(t, lp) for t, lp in zip(tokens, logprobs)]

    def finish(self, stop_reason: str | None, truncated: bool = False) -> None:
        if stop_reason is not None:
            self.stop_reason = stop_reason
        self.truncated = self.truncated or truncated
        self.done = True

    def output(self) -> RolloutTrajectory:
        """The training fields, and the trajectory's fields plus what the rollout recorded."""
        has_logprobs = bool(self.logprobs) and not self.missing_logprobs
        training: dict[str, Any] = {"input_ids": list(self.input_ids), "labels": list(self.labels)}
        if has_logprobs:
            training["old_logprobs"] = self._old_logprobs()
        record = {key: self.source[key] for key in self.source.keys() if key not in training}
        record.update(
            messages=self.messages,
            logprobs=list(self.logprobs) if has_logprobs else None,
            turns=self.turns,
            stop_reason=self.stop_reason,
            truncated=self.truncated,
        )
        return RolloutTrajectory(training, record)

    def _old_logprobs(self) -> list[float]:
        """The log-probs on the ``input_ids`` grid: each sampled token's at its position, 0 else."""
        values = iter(self.logprobs)
        return [0.0 if label == IGNORE_INDEX else float(next(values)) for label in self.labels]


def _pairs(token: int, logprob: float) -> TokenLogprob:
    """``logprob`` as a :class:`TokenLogprob`, so ``lp[0][1]`` reads the sampled token's."""
    if isinstance(logprob, TokenLogprob) and len(logprob):
        return logprob
    return TokenLogprob(float(logprob), ((token, float(logprob)),))
