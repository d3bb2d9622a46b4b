"""Row preprocessors: raw dataset rows -> trajectory dicts ``{'messages': [...]}``.

Pass one to ``Dataset.map`` by name (``'SelfCognitionProcessor'``), class, instance or as any
``row -> dict | None`` function.
"""

from twinkle.preprocessor._registry import (
    get_preprocessor,
    list_preprocessors,
    register_preprocessor,
)
from twinkle.preprocessor.base import MissingFieldError, Preprocessor
from twinkle.preprocessor.chat import AlpacaProcessor, MessagesProcessor, SelfCognitionProcessor

__all__ = [
    "AlpacaProcessor",
    "MessagesProcessor",
    "MissingFieldError",
    "Preprocessor",
    "SelfCognitionProcessor",
    "get_preprocessor",
    "list_preprocessors",
    "register_preprocessor",
]
