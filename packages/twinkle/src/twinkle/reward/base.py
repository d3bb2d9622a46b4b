"""The reward contract and how completions are read from each kind of input."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from twinkle.errors import ArgumentTypeError, InvalidArgumentError


@dataclass(frozen=True)
class Completion:
    """One completion to score.

    Attributes:
        text: The completion: a sampled sequence's text or a trajectory's last assistant message.
        data: Per-sample data: ``Trajectory.extra`` / ``SampleResult.extra`` merged with upstream's
            ``user_data`` (a list of ``(key, value)`` pairs or of dicts).
        reference: The ground truth passed to the call for this sample, if any.
    """

    text: str
    data: Mapping[str, Any] = field(default_factory=dict)
    reference: Any = None


class Reward:
    """Base class of rewards. ``reward(samples, ground_truths=None) -> float32 [N]``.

    Subclasses implement :meth:`score` for one completion, or override ``__call__``.
    """

    def __call__(self, trajectories: Any, ground_truths: Any = None, **kwargs: Any) -> np.ndarray:
        """Score every completion in ``trajectories`` (see :func:`completions` for the inputs)."""
        scores = [float(self.score(c)) for c in completions(trajectories, ground_truths)]
        return np.asarray(scores, dtype=np.float32)

    def score(self, completion: Completion) -> float:
        """The reward of one completion."""
        raise NotImplementedError(f"{type(self).__name__} implements neither score nor __call__")


def completions(samples: Any, ground_truths: Any = None) -> list[Completion]:
    """The completions in ``samples``, flat, with their data and references.

    Args:
        samples: A ``SampleResponse`` or list of ``SampleResult`` (each sequence is one
            completion), a list of trajectories (dicts or ``Trajectory``), of sampled sequences
            (objects with ``.text``), or of strings.
        ground_truths: ``None``/``[]``, or one reference per item of ``samples`` (repeated for
            each sequence of a ``SampleResult``); a trajectory reference stands for its last
            message's text.

    Raises:
        InvalidArgumentError: references that do not match the inputs one to one.
        ArgumentTypeError: an item of an unknown kind.
    """
    items = list(samples)
    references: Sequence[Any] | None = list(ground_truths) if ground_truths else None
    if references is not None and len(references) != len(items):
        raise InvalidArgumentError(f"{len(references)} references for {len(items)} inputs")
    out = []
    for i, item in enumerate(items):
        reference = _reference(references[i]) if references is not None else None
        for text, data in _texts(item):
            out.append(Completion(text=text, data=data, reference=reference))
    return out


def user_value(data: Mapping[str, Any] | Any, key: str, default: Any = None) -> Any:
    """``key`` of a sample's data: a :class:`Completion`'s ``data``, or a trajectory's merged
    ``extra`` and ``user_data``."""
    if not isinstance(data, Mapping) or _is_trajectory(data):
        data = _data_of(data)
    return data.get(key, default)


def _texts(item: Any) -> Iterable[tuple[str, Mapping[str, Any]]]:
    if isinstance(item, str):
        return [(item, {})]
    if _is_sample_result(item):
        extra = dict(getattr(item, "extra", None) or {})
        return [(seq.text, extra) for seq in item.sequences]
    if _is_trajectory(item):
        return [(last_assistant_text(_get(item, "messages") or []), _data_of(item))]
    if hasattr(item, "text"):
        return [(str(item.text), {})]
    raise ArgumentTypeError(
        f"cannot read a completion from {type(item).__name__}: pass trajectories (a mapping "
        f"needs 'messages'), sample results or strings"
    )


def _is_sample_result(item: Any) -> bool:
    return hasattr(item, "sequences") and hasattr(item, "prompt_tokens")


def _is_trajectory(item: Any) -> bool:
    if isinstance(item, Mapping):
        return "messages" in item
    return hasattr(item, "messages")


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def _data_of(trajectory: Any) -> dict[str, Any]:
    data = dict(_get(trajectory, "extra") or {})
    user_data = _get(trajectory, "user_data")
    if isinstance(user_data, Mapping):
        data.update(user_data)
    elif isinstance(user_data, (list, tuple)):
        for entry in user_data:
            if isinstance(entry, Mapping):
                data.update(entry)
            elif isinstance(entry, (list, tuple)) and len(entry) == 2:
                data[str(entry[0])] = entry[1]
    return data


def message_text(message: Any) -> str:
    """The text of a message (a dict or ``Message``), its text parts joined."""
    content = _get(message, "content", "")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif _get(part, "type", "text") == "text":
            parts.append(str(_get(part, "text", "") or ""))
    return "".join(parts)


def last_assistant_text(messages: Sequence[Any]) -> str:
    """The text of the last assistant message, ``''`` when there is none."""
    for message in reversed(list(messages)):
        if _get(message, "role") == "assistant":
            return message_text(message)
    return ""


def _reference(reference: Any) -> Any:
    if _is_trajectory(reference):
        messages = list(_get(reference, "messages") or [])
        return message_text(messages[-1]) if messages else ""
    return reference
