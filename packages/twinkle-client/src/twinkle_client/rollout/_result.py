"""``RolloutTrajectory``: one rolled-out trajectory, a training sample that also reads its record."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_MISSING = object()


class RolloutTrajectory(dict):
    """A rolled-out trajectory.

    As a ``dict`` it holds the training fields only: ``input_ids``, ``labels`` and, with
    log-probs, ``old_logprobs``. That is what ``dict(t)``, ``{**t}``, iteration and
    ``model.forward_backward(inputs=[t, ...])`` see, so a training call sends tokens, not chat
    records. By key (``t['turns']``, ``t.get('logprobs')``, ``'messages' in t``) and in
    :attr:`record` it also reads the rest: the input trajectory's fields (``messages``,
    ``tools``, ``user_data``...) as the rollout left them, ``logprobs``, ``turns``,
    ``stop_reason`` and ``truncated``.

    Attributes:
        record: The non-training fields.
    """

    def __init__(self, training: Mapping[str, Any], record: Mapping[str, Any]) -> None:
        super().__init__(training)
        self.record = dict(record)

    def __getitem__(self, key: str) -> Any:
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        value = self.record.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or key in self.record

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def __repr__(self) -> str:
        return f"RolloutTrajectory({dict.__repr__(self)}, record={self.record!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (dict(self), self.record))
