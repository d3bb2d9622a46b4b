"""``Template``: renders trajectories as ChatML and tokenises them with exact loss masks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twinkle.data_format import IGNORE_INDEX, InputFeature, Message, Trajectory

TRUNCATION_STRATEGIES = ("raise", "left", "right", "delete")

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

# A rendered piece of text and whether the model is trained to produce it.
Segment = tuple[str, bool]


class Template:
    """Chat template: trajectory -> text -> token ids and labels.

    Messages render as ChatML, ``<|im_start|>{role}\\n{content}<|im_end|>\\n``; an assistant turn
    with ``reasoning_content`` renders ``<think>\\n{reasoning}\\n</think>\\n\\n{content}``. Text is
    tokenised per segment, so the labels are exact: only assistant content and its closing
    ``<|im_end|>`` (so the model learns to stop) carry token ids, everything else is ``-100``.

    Args:
        model_id: The model whose tokenizer to use (``ms://``, ``hf://``, ``tiny://`` or a local
            directory). ``None`` means the model this template is attached to supplies it later
            (by setting ``template.model_id``).
        max_length: Longest allowed sample in tokens; ``None`` for no limit.
        truncation_strategy: What to do with a longer sample: ``'raise'`` a ValueError naming
            the length and the limit; ``'left'`` drops tokens on the left (keeps the last
            ``max_length``); ``'right'`` drops them on the right (keeps the first); ``'delete'``
            drops the sample (``encode`` returns ``None``, ``Dataset.encode`` removes it).
        tokenizer: A ready tokenizer, instead of loading one for ``model_id``.

    Raises:
        ValueError: On an unknown truncation strategy or a non-positive ``max_length``.
    """

    def __init__(
        self,
        model_id: str | None = None,
        max_length: int | None = None,
        truncation_strategy: str = "raise",
        tokenizer: Any = None,
    ) -> None:
        if truncation_strategy not in TRUNCATION_STRATEGIES:
            raise ValueError(
                f"unknown truncation_strategy {truncation_strategy!r}; "
                f"expected one of {list(TRUNCATION_STRATEGIES)}"
            )
        if max_length is not None and max_length <= 0:
            raise ValueError(f"max_length must be a positive number of tokens, got {max_length}")
        self._model_id = model_id
        self.max_length = max_length
        self.truncation_strategy = truncation_strategy
        self._tokenizer = tokenizer

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(model_id={self._model_id!r}, max_length={self.max_length!r}, "
            f"truncation_strategy={self.truncation_strategy!r})"
        )

    @property
    def model_id(self) -> str | None:
        """The model whose tokenizer is used; setting a new one drops the loaded tokenizer."""
        return self._model_id

    @model_id.setter
    def model_id(self, value: str | None) -> None:
        if value != self._model_id:
            self._model_id = value
            self._tokenizer = None

    @property
    def tokenizer(self) -> Any:
        """The tokenizer, loaded from ``model_id`` on first use.

        Raises:
            RuntimeError: If neither a tokenizer nor a ``model_id`` was given.
        """
        if self._tokenizer is None:
            if self._model_id is None:
                raise RuntimeError(
                    f"{type(self).__name__} has no tokenizer: pass model_id=... (or tokenizer=...), "
                    "or attach the template to a model, which sets its model_id"
                )
            from twinkle.hub import load_tokenizer

            self._tokenizer = load_tokenizer(self._model_id)
        return self._tokenizer

    @property
    def pad_token_id(self) -> int:
        """Id used to pad batches: the tokenizer's pad token, else its eos token."""
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else self.eos_token_id

    @property
    def eos_token_id(self) -> int:
        """Id that ends an assistant turn (``<|im_end|>`` for ChatML)."""
        tok = self.tokenizer
        if tok.eos_token_id is not None:
            return tok.eos_token_id
        return tok.convert_tokens_to_ids(IM_END)

    def render(self, trajectory: Trajectory | dict, add_generation_prompt: bool = False) -> str:
        """Return the trajectory as the exact text the model sees."""
        segments = self._segments(Trajectory.coerce(trajectory), add_generation_prompt)
        return "".join(text for text, _ in segments)

    def encode(
        self, trajectory: Trajectory | dict, add_generation_prompt: bool = False
    ) -> InputFeature | None:
        """Tokenise one trajectory.

        Returns:
            The ``InputFeature``, or ``None`` when it is too long and the strategy is ``'delete'``.

        Raises:
            ValueError: If it is too long and the strategy is ``'raise'``.
        """
        return self.batch_encode([trajectory], add_generation_prompt)[0]

    def batch_encode(
        self, trajectories: Sequence[Trajectory | dict], add_generation_prompt: bool = False
    ) -> list[InputFeature | None]:
        """Tokenise many trajectories with one tokenizer call.

        Returns:
            One ``InputFeature`` per trajectory, in order; ``None`` in place of each sample the
            ``'delete'`` strategy drops.
        """
        per_sample = [
            _merge(self._segments(Trajectory.coerce(t), add_generation_prompt))
            for t in trajectories
        ]
        texts = [text for segments in per_sample for text, _ in segments]
        ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        features: list[InputFeature | None] = []
        cursor = 0
        for segments in per_sample:
            input_ids: list[int] = []
            labels: list[int] = []
            for _, trainable in segments:
                piece = list(ids[cursor])
                cursor += 1
                input_ids += piece
                labels += piece if trainable else [IGNORE_INDEX] * len(piece)
            features.append(self._fit(input_ids, labels))
        return features

    def decode(self, token_ids: Sequence[int] | Any, skip_special_tokens: bool = False) -> str:
        """Turn token ids (list, numpy array or tensor) back into text."""
        if hasattr(token_ids, "tolist"):
            token_ids = token_ids.tolist()
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def _segments(self, trajectory: Trajectory, add_generation_prompt: bool) -> list[Segment]:
        segments: list[Segment] = []
        for message in trajectory.messages:
            segments += self._render_message(message)
        if add_generation_prompt:
            segments.append((self._generation_prompt(), False))
        return segments

    def _render_message(self, message: Message) -> list[Segment]:
        """Render one message; override to change the chat format of a model family."""
        header = f"{IM_START}{message.role}\n"
        if message.role != "assistant":
            return [(f"{header}{message.content}{IM_END}\n", False)]
        body = message.content
        if message.reasoning_content:
            body = f"<think>\n{message.reasoning_content}\n</think>\n\n{body}"
        return [(header, False), (f"{body}{IM_END}", True), ("\n", False)]

    def _generation_prompt(self) -> str:
        return f"{IM_START}assistant\n"

    def _fit(self, input_ids: list[int], labels: list[int]) -> InputFeature | None:
        """Apply ``max_length`` with the truncation strategy."""
        limit = self.max_length
        if limit is not None and len(input_ids) > limit:
            strategy = self.truncation_strategy
            if strategy == "raise":
                raise ValueError(
                    f"sample has {len(input_ids)} tokens, more than max_length={limit}; "
                    "raise max_length or pick truncation_strategy 'left', 'right' or 'delete'"
                )
            if strategy == "delete":
                return None
            window = slice(-limit, None) if strategy == "left" else slice(0, limit)
            input_ids, labels = input_ids[window], labels[window]
        return InputFeature(input_ids=input_ids, labels=labels, length=len(input_ids))


def _merge(segments: list[Segment]) -> list[Segment]:
    """Join neighbours with the same trainable flag: fewer, longer pieces tokenise more naturally."""
    merged: list[Segment] = []
    for text, trainable in segments:
        if not text:
            continue
        if merged and merged[-1][1] == trainable:
            merged[-1] = (merged[-1][0] + text, trainable)
        else:
            merged.append((text, trainable))
    return merged
