"""``Template``: renders trajectories as ChatML and tokenises them with exact loss masks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twinkle.data_format import IGNORE_INDEX, ImagePart, InputFeature, Message, Trajectory
from twinkle.template import _vision

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

    A message whose content is a list of parts renders its text parts as they are and each image
    as ``<|vision_start|><|image_pad|><|vision_end|>`` (Qwen-VL / Qwen3.5's chat template). On a
    model with an image processor, ``encode`` repeats ``<|image_pad|>`` once per image token
    and adds ``pixel_values`` and ``image_grid_thw`` to the feature; image and vision tokens
    never carry a loss.

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
        self._image_processor: Any = None

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
            self._image_processor = None

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
    def image_processor(self) -> Any:
        """The model's image processor, or ``None`` when the model reads no images."""
        if self._image_processor is None and self._model_id is not None:
            self._image_processor = _vision.load_image_processor(self._model_id) or False
        return self._image_processor or None

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
        per_sample, images = [], []
        for item in trajectories:
            trajectory = Trajectory.coerce(item)
            segments = _merge(self._segments(trajectory, add_generation_prompt))
            inputs = self._image_inputs(trajectory.images)
            if inputs is not None:
                texts = _vision.expand_image_pads([t for t, _ in segments], inputs.tokens_per_image)
                segments = [(t, trainable) for t, (_, trainable) in zip(texts, segments)]
            per_sample.append(segments)
            images.append(inputs)
        texts = [text for segments in per_sample for text, _ in segments]
        ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        no_loss = self._vision_token_ids() if any(images) else set()
        features: list[InputFeature | None] = []
        cursor = 0
        for segments, inputs in zip(per_sample, images):
            input_ids: list[int] = []
            labels: list[int] = []
            for _, trainable in segments:
                piece = list(ids[cursor])
                cursor += 1
                input_ids += piece
                if trainable:
                    labels += [IGNORE_INDEX if t in no_loss else t for t in piece]
                else:
                    labels += [IGNORE_INDEX] * len(piece)
            features.append(self._fit(input_ids, labels, inputs))
        return features

    def _image_inputs(self, parts: list[ImagePart]) -> _vision.ImageInputs | None:
        if not parts:
            return None
        processor = self.image_processor
        if processor is None:
            raise ValueError(
                f"content: the sample has {len(parts)} image(s) but model {self._model_id!r} "
                "has no image processor (a text-only model cannot read images)"
            )
        return _vision.process_images(processor, parts)

    def _vision_token_ids(self) -> set[int]:
        vocab = self.tokenizer.get_vocab()
        return {vocab[token] for token in _vision.VISION_TOKENS if token in vocab}

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
        content = self._render_content(message)
        if message.role != "assistant":
            return [(f"{header}{content}{IM_END}\n", False)]
        body = content
        if message.reasoning_content:
            body = f"<think>\n{message.reasoning_content}\n</think>\n\n{body}"
        return [(header, False), (f"{body}{IM_END}", True), ("\n", False)]

    def _render_content(self, message: Message) -> str:
        """A message's content as text: parts joined, each image as its placeholder."""
        if isinstance(message.content, str):
            return message.content
        return "".join(
            _vision.IMAGE_PLACEHOLDER if isinstance(part, ImagePart) else part.text
            for part in message.content
        )

    def _generation_prompt(self) -> str:
        return f"{IM_START}assistant\n"

    def _fit(
        self,
        input_ids: list[int],
        labels: list[int],
        images: _vision.ImageInputs | None = None,
    ) -> InputFeature | None:
        """Apply ``max_length`` with the truncation strategy.

        A cut may not remove image tokens: an image's features fill all of its tokens or none.
        """
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
            if images is not None:
                self._check_cut_keeps_images(input_ids, window)
            input_ids, labels = input_ids[window], labels[window]
        if images is None:
            return InputFeature(input_ids=input_ids, labels=labels, length=len(input_ids))
        return InputFeature(
            input_ids=input_ids,
            labels=labels,
            length=len(input_ids),
            pixel_values=images.pixel_values,
            image_grid_thw=images.image_grid_thw,
        )

    def _check_cut_keeps_images(self, input_ids: list[int], window: slice) -> None:
        pad = self.tokenizer.convert_tokens_to_ids(_vision.IMAGE_PAD)
        if input_ids.count(pad) != input_ids[window].count(pad):
            raise ValueError(
                f"sample has {len(input_ids)} tokens, more than max_length={self.max_length}, "
                f"and truncating it ({self.truncation_strategy!r}) would cut image tokens; raise "
                "max_length or use truncation_strategy 'delete'"
            )


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
