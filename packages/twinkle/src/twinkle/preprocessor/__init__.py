"""Row preprocessors: raw dataset rows -> trajectories (``{'messages': [...]}``), and filters.

Pass one to ``Dataset.map`` by name (``'SelfCognitionProcessor'``), class, instance or as any
``row -> Trajectory | dict | None`` function; upstream-style batch preprocessors (columns in,
columns out through ``map_col_to_row`` / ``map_row_to_col``) work too. ``Dataset.filter``
takes a ``DataFilter``, a ``Filter`` or any ``row -> bool`` function.
"""

from twinkle.preprocessor._registry import (
    get_preprocessor,
    list_preprocessors,
    register_preprocessor,
)
from twinkle.preprocessor.base import (
    DataFilter,
    Filter,
    Mapper,
    MissingFieldError,
    Preprocessor,
)
from twinkle.preprocessor.chat import AlpacaProcessor, MessagesProcessor, SelfCognitionProcessor
from twinkle.preprocessor.dpo import EmojiDPOProcessor
from twinkle.preprocessor.llm import (
    CompetitionMathGRPOProcessor,
    CompetitionMathProcessor,
    CountdownProcessor,
    GSM8KProcessor,
)

__all__ = [
    "AlpacaProcessor",
    "CompetitionMathGRPOProcessor",
    "CompetitionMathProcessor",
    "CountdownProcessor",
    "DataFilter",
    "EmojiDPOProcessor",
    "Filter",
    "GSM8KProcessor",
    "Mapper",
    "MessagesProcessor",
    "MissingFieldError",
    "Preprocessor",
    "SelfCognitionProcessor",
    "get_preprocessor",
    "list_preprocessors",
    "register_preprocessor",
]
