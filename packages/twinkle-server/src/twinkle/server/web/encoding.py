"""Values -> JSON for replies: the one conversion every server component shares.

JSON has no NaN or infinity, and a reply holding one would fail to serialise (a 500 for a
result the model computed). A non-finite float is sent as the string ``"NaN"``, ``"Infinity"``
or ``"-Infinity"``: protobuf's JSON mapping spells them so, pydantic's float fields (the Tinker
SDK's ``OptimStepResponse.metrics``) read them back as floats, and ``float()`` and numpy's
``asarray(..., dtype=float)`` accept them.
"""

from __future__ import annotations

import math
from typing import Any

from twinkle_client._wire import jsonable as plain_jsonable

NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def jsonable(value: Any) -> Any:
    """``twinkle_client``'s conversion (arrays, tensors, models, dataclasses -> plain values),
    then every non-finite float spelt as a string (:func:`finite_json`)."""
    return finite_json(plain_jsonable(value))


def finite_json(value: Any) -> Any:
    """Plain JSON values with each NaN, ``inf`` and ``-inf`` replaced by ``"NaN"``,
    ``"Infinity"``, ``"-Infinity"``; anything else is returned as is (lists of finite numbers
    are checked in one pass and not copied)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else NON_FINITE[str(value)]
    if isinstance(value, list):
        try:
            if all(map(math.isfinite, value)):
                return value
        except (TypeError, OverflowError):  # not only numbers (or an int beyond floats)
            pass
        return [finite_json(v) for v in value]
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    return value


__all__ = ["NON_FINITE", "finite_json", "jsonable"]
