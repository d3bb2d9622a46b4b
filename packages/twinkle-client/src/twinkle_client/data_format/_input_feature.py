"""``InputFeature``: one tokenised training sample as a dict of numpy arrays."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

IGNORE_INDEX = -100
"""The label of a position that is not trained (Hugging Face's ``ignore_index``)."""

# Keys that hold token ids and must stay integral whatever the caller passed in.
_INT_KEYS = ("input_ids", "labels")


class InputFeature(dict):
    """A tokenised sample: a plain ``dict`` whose sequence values are numpy arrays.

    Required keys are ``input_ids`` (int64 ``[T]``) and ``labels`` (int64 ``[T]``, ``-100`` where no
    loss is taken); ``length`` (``T``) is filled in when missing. Any other key is kept, with lists
    turned into numpy arrays, so RL data such as ``advantages`` or ``logprobs`` can ride along.

    Being a ``dict`` it pickles, compares and prints like one, and ``feature['input_ids'].tolist()``
    gives plain ints for JSON or the Tinker SDK.

    Example:
        >>> f = InputFeature(input_ids=[1, 2, 3], labels=[-100, 2, 3])
        >>> f['input_ids'].tolist(), f['length']
        ([1, 2, 3], 3)
    """

    def __init__(self, data: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        merged = dict(data or {}, **kwargs)
        if "input_ids" not in merged:
            raise ValueError("InputFeature needs 'input_ids'")
        input_ids = np.asarray(merged["input_ids"], dtype=np.int64).reshape(-1)
        merged["input_ids"] = input_ids
        if merged.get("labels") is None:
            merged["labels"] = np.full_like(input_ids, -100)
        for key, value in merged.items():
            if key in _INT_KEYS:
                merged[key] = np.asarray(value, dtype=np.int64).reshape(-1)
            elif isinstance(value, (list, tuple)) and _is_numeric_sequence(value):
                merged[key] = np.asarray(value)
        if merged["labels"].shape != input_ids.shape:
            raise ValueError(
                f"labels has {merged['labels'].shape[0]} tokens but input_ids has "
                f"{input_ids.shape[0]}"
            )
        merged["length"] = int(merged.get("length", input_ids.shape[0]))
        super().__init__(merged)

    @property
    def input_ids(self) -> np.ndarray:
        """The token ids, int64 ``[T]``."""
        return self["input_ids"]

    @property
    def labels(self) -> np.ndarray:
        """The per-token targets, int64 ``[T]``; ``-100`` means no loss."""
        return self["labels"]

    def to_json_dict(self) -> dict[str, Any]:
        """Return a JSON-serialisable copy (arrays become lists, numpy scalars become Python)."""
        return {key: _to_builtin(value) for key, value in self.items()}

    @classmethod
    def coerce(cls, value: InputFeature | Mapping[str, Any]) -> InputFeature:
        """Return ``value`` as an ``InputFeature``, converting a plain mapping."""
        return value if isinstance(value, cls) else cls(value)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        # Lets wire models declare ``list[InputFeature]`` fields: validated from dicts of lists,
        # serialised back to lists.
        from pydantic_core import core_schema

        return core_schema.no_info_plain_validator_function(
            cls.coerce,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda value: InputFeature.coerce(value).to_json_dict()
            ),
        )


def _is_numeric_sequence(value: list | tuple) -> bool:
    """Whether a list converts to a numeric numpy array (not strings, dicts or ragged lists)."""
    try:
        return np.asarray(value).dtype.kind in "biuf"
    except ValueError:
        return False


def _to_builtin(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value
