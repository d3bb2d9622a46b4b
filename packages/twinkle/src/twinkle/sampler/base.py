"""``Sampler``: the interface every sampling backend implements, and the input handling they share."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from twinkle.data_format import Trajectory
from twinkle.errors import ArgumentTypeError, InvalidArgumentError, UnknownAdapterError
from twinkle.model.protocol import capabilities_of
from twinkle.sampler.types import SampleResponse, SamplingParams
from twinkle_client.sampler.types import input_fields, use_logprob_pairs

LIVE_ADAPTER_SCHEME = "inflight://"
_TOKEN_KEYS = ("input_ids", "labels", "length", "attention_mask", "position_ids")
_IMAGE_KEYS = ("pixel_values", "image_grid_thw")


@dataclass
class Prompt:
    """One input as token ids, with the data that rides along (``Trajectory.extra``).

    ``pixel_values`` / ``image_grid_thw`` are the prompt's images as the template's
    ``encode`` makes them (``None`` for a text-only prompt); ``tokens`` then holds one
    ``<|image_pad|>`` per image token.
    """

    tokens: list[int]
    extra: dict[str, Any] = field(default_factory=dict)
    pixel_values: Any = None
    image_grid_thw: Any = None

    @property
    def has_images(self) -> bool:
        return self.image_grid_thw is not None and len(self.image_grid_thw) > 0


class Sampler(ABC):
    """Generates completions for trajectories or token ids, each input with its own adapter.

    Subclasses implement :meth:`_generate`; this class turns inputs into prompts (trajectories
    through the template with its generation prompt), validates the parameters and the
    per-input ``adapter_uri``.

    Args:
        model_id: The base model (``tiny://qwen3.5``, ``ms://org/name``, a directory, ...).
        max_length: Most tokens a sequence may hold, prompt and completion together: a prompt
            longer, or one whose ``max_tokens`` would take it past, is refused
            (:func:`check_prompt_lengths`). ``None``: no limit.

    Attributes:
        supports_extra_logprobs: Whether the backend serves ``topk_prompt_logprobs``,
            ``prompt_logprobs_last_n``, ``prompt_alt_tokens_k`` and ``target_prompt_token_ids``;
            others refuse them instead of ignoring them. Every backend serves ``topk_logprobs``.
        live_adapters: Whether ``self.adapters`` holds adapters published from memory
            (``put_state``, ``has_state``, ``drop_state``): what the server's inflight sampling
            needs.
    """

    supports_extra_logprobs: bool = False
    live_adapters: bool = False

    def __init__(self, model_id: str, max_length: int | None = None) -> None:
        self.model_id = model_id
        self.max_length = max_length
        self.template = None
        self._named: dict[str, str] = {}
        self._declared: dict[str, dict[str, Any]] = {}

    def set_template(self, template: Any, model_id: str | None = None, **kwargs: Any) -> None:
        """Use ``template`` (a name such as ``'Qwen3_5Template'``, a class or an instance) to
        render trajectory inputs; ``model_id`` defaults to the sampler's model."""
        from twinkle.template import Template, get_template

        if isinstance(template, Template):
            self.template = template
        else:
            self.template = get_template(template, model_id=model_id or self.model_id, **kwargs)

    def _template(self):
        if self.template is None:
            self.set_template("Template")
        return self.template

    def load_adapter_from_model(self, model: Any, adapter_name: str | None = None) -> str:
        """Take the current weights of ``model``'s adapter ``adapter_name``, with no checkpoint.

        The live tensors are copied from the training model in memory (no file, no
        serialisation) into this sampler's adapter ``inflight://<adapter_name>``, replacing what
        it held. Call it again after each ``optim_step`` to sample with the new weights; later
        steps do not change what was copied.

        Args:
            model: A ``MultiLoraTransformersModel`` in this process.
            adapter_name: The model's adapter (``None``: its only one).

        Returns:
            The uri to pass as ``sample(adapter_uri=...)``; ``sample(adapter_name=...)`` with
            the same name works too.

        Raises:
            InvalidArgumentError: The sampler or the model cannot hand adapters over in memory
                (the torch sampler and the transformers model can), or the adapter does not fit.
        """
        capabilities = capabilities_of(model)
        if not (capabilities.adapter_state_io and capabilities.local_tenants):
            raise InvalidArgumentError(
                f"model: {type(model).__name__} cannot hand its adapter over in memory; "
                "MultiLoraTransformersModel can (or save() and sample with the path)"
            )
        name = adapter_name or model.tenant(None).name
        uri = f"{LIVE_ADAPTER_SCHEME}{name}"
        self._put_live_adapter(uri, model, adapter_name)
        self._named[name] = uri
        return uri

    def add_adapter_to_sampler(self, adapter_name: str, config: Any) -> None:
        """Declare the LoRA adapter ``adapter_name`` (a PEFT ``LoraConfig`` or its dict) before
        its weights arrive.

        ``sample(adapter_name=...)`` accepts the name at once. Until weights are loaded under it
        (:meth:`load_adapter_from_model` with the same name, or ``load_adapter(uri,
        adapter_name=...)``), sampling with it uses the base model, which is what a freshly
        initialised LoRA (``B = 0``) computes.

        Raises:
            InvalidArgumentError: An empty name or a config without a positive rank ``r``.
            ArgumentTypeError: A config that is neither a PEFT config nor a mapping.
        """
        self._declared[_adapter_name(adapter_name)] = lora_config_dict(config)

    def _put_live_adapter(self, uri: str, model: Any, adapter_name: str | None) -> None:
        """Hold a copy of ``model``'s adapter under ``uri``; backends that keep their adapters
        in this process override it."""
        raise InvalidArgumentError(
            f"{type(self).__name__} cannot load adapters from memory; TorchSampler can "
            "(or save() and sample with the path)"
        )

    @property
    def stop_token_ids(self) -> set[int]:
        """Token ids that always end a sequence: the template's end-of-turn and eos tokens."""
        template = self._template()
        ids = {int(template.eos_token_id)}
        im_end = template.tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(im_end, int) and im_end != getattr(template.tokenizer, "unk_token_id", None):
            ids.add(im_end)
        return ids

    def sample(
        self,
        inputs: Any,
        sampling_params: SamplingParams | Mapping[str, Any] | None = None,
        adapter_uri: str | Sequence[str | None] | None = None,
        adapter_name: str | None = None,
        num_samples: int | None = None,
    ) -> SampleResponse:
        """Sample completions.

        Args:
            inputs: Trajectories (rendered with the template and its generation prompt),
                ``InputFeature``s / dicts with ``input_ids`` (used as they are, even with
                ``messages``), or lists of token ids; one input alone is accepted too.
            sampling_params: :class:`SamplingParams`, a dict of its fields, another object
                with those field names, or ``None``.
            adapter_uri: A PEFT adapter directory (``model.save(...)``) for every input, a list
                with one uri (or ``None`` for the base model) per input, or ``None``.
            adapter_name: An adapter the sampler already holds under this name, instead of a
                uri; ``''`` is no adapter.
            num_samples: Sequences per input, instead of ``sampling_params.num_samples``.

        Returns:
            One :class:`SampleResult` per input, in order; each sequence's
            ``new_input_feature`` is the input with that completion, ready to train on.

        Raises:
            ValueError: Invalid parameters, inputs, a prompt that does not fit ``max_length``
                with ``max_tokens``, or an adapter that does not fit the model.
            FileNotFoundError: A missing adapter directory.
            PermissionError: An adapter outside the allowed directories.
        """
        # twinkle_client (numpy only) validates the parameters but cannot raise twinkle.errors.
        try:
            params = with_num_samples(SamplingParams.coerce(sampling_params), num_samples)
        except (TypeError, ValueError) as exc:
            raise (ArgumentTypeError if isinstance(exc, TypeError) else InvalidArgumentError)(
                str(exc)
            ) from exc
        self._check_extra_logprobs(params)
        items = _input_items(inputs)
        prompts = self.prepare_prompts(items)
        check_prompt_lengths([len(p.tokens) for p in prompts], params.max_tokens, self.max_length)
        uris = self._per_input_uris(adapter_uri, len(prompts))
        adapter_name = adapter_name or None
        if adapter_name is not None and adapter_uri is not None:
            raise InvalidArgumentError("pass adapter_uri or adapter_name, not both")
        response = self._generate(prompts, params, uris, adapter_name)
        use_logprob_pairs(response, params)
        return SampleResponse(
            replace(result, input_fields=_prompt_fields(item, prompt))
            for result, item, prompt in zip(response, items, prompts)
        )

    def _check_extra_logprobs(self, params: SamplingParams) -> None:
        asked = [
            name
            for name in (
                "topk_prompt_logprobs",
                "prompt_logprobs_last_n",
                "prompt_alt_tokens_k",
                "target_prompt_token_ids",
            )
            if getattr(params, name)
        ]
        if asked and not self.supports_extra_logprobs:
            raise InvalidArgumentError(
                f"{type(self).__name__} does not support {', '.join(asked)}; the torch sampler does"
            )

    def _named_adapter_uris(
        self, adapter_name: str | None, adapter_uris: list[str | None]
    ) -> list[str | None]:
        """``adapter_uris``, or the adapter loaded as ``adapter_name`` for every prompt (the
        base model for a name declared with :meth:`add_adapter_to_sampler` but not loaded yet).

        Raises:
            ValueError: If no adapter was loaded or declared under ``adapter_name``.
        """
        if adapter_name is None:
            return adapter_uris
        if adapter_name not in self._named and adapter_name in self._declared:
            return [None] * len(adapter_uris)
        if adapter_name not in self._named:
            raise UnknownAdapterError(
                f"unknown adapter_name {adapter_name!r}; load it with load_adapter(uri, adapter_name=...)"
            )
        return [self._named[adapter_name]] * len(adapter_uris)

    @abstractmethod
    def _generate(
        self,
        prompts: list[Prompt],
        params: SamplingParams,
        adapter_uris: list[str | None],
        adapter_name: str | None,
    ) -> SampleResponse:
        """Backend work: sample ``params.num_samples`` sequences for every prompt."""

    # ------------------------------------------------------------------ inputs
    def prepare_prompts(self, inputs: Any) -> list[Prompt]:
        """Inputs as prompts of token ids.

        Raises:
            ValueError: On empty inputs or an empty prompt.
        """
        items = _input_items(inputs)
        prompts = [self._prompt(item) for item in items]
        for i, prompt in enumerate(prompts):
            if not prompt.tokens:
                raise InvalidArgumentError(f"input {i} has no tokens")
        return prompts

    def _prompt(self, item: Any) -> Prompt:
        if isinstance(item, Trajectory) or (
            isinstance(item, Mapping) and "messages" in item and "input_ids" not in item
        ):
            trajectory = Trajectory.coerce(dict(item) if not isinstance(item, Trajectory) else item)
            feature = self._template().encode(trajectory, add_generation_prompt=True)
            return Prompt(
                [int(t) for t in feature["input_ids"]],
                dict(trajectory.extra),
                *_images(feature),
            )
        if isinstance(item, Mapping):
            if "input_ids" not in item:
                raise InvalidArgumentError(
                    "an input mapping needs 'messages' (a trajectory) or 'input_ids'"
                )
            extra = dict(item.get("extra") or {})
            skip = {*_TOKEN_KEYS, *_IMAGE_KEYS, "extra"}
            extra.update({k: v for k, v in item.items() if k not in skip})
            return Prompt(_token_list(item["input_ids"]), extra, *_images(item))
        return Prompt(_token_list(item))

    @staticmethod
    def _per_input_uris(adapter_uri: Any, count: int) -> list[str | None]:
        if (
            adapter_uri is None
            or isinstance(adapter_uri, (str, bytes))
            or hasattr(adapter_uri, "__fspath__")
        ):
            return [None if adapter_uri is None else str(adapter_uri)] * count
        uris = [None if u is None else str(u) for u in adapter_uri]
        if len(uris) != count:
            raise InvalidArgumentError(f"adapter_uri has {len(uris)} entries for {count} inputs")
        return uris


def check_prompt_lengths(
    lengths: Sequence[int | None], max_tokens: int, max_length: int | None
) -> None:
    """Refuse prompts that do not fit ``max_length`` tokens with their completion.

    The rule training applies to its inputs (a sequence over ``max_length`` is refused), for a
    sequence that is yet to grow: the prompt alone, and the prompt with ``max_tokens`` new
    tokens, must each fit. A prompt of exactly ``max_length - max_tokens`` tokens fits.

    Args:
        lengths: Each prompt's token count, in input order; ``None`` for one not measured yet
            (a trajectory before its template renders it), which is skipped.
        max_tokens: Tokens each completion may add (``sampling_params.max_tokens``).
        max_length: The limit; ``None`` checks nothing.

    Raises:
        InvalidArgumentError: The first prompt that does not fit, with the limit and the room
            it leaves.
    """
    if max_length is None:
        return
    for i, length in enumerate(lengths):
        if length is None:
            continue
        if length > max_length:
            raise InvalidArgumentError(
                f"inputs[{i}] has {length} prompt tokens, over the model's max_length={max_length}"
            )
        if length + max_tokens > max_length:
            raise InvalidArgumentError(
                f"inputs[{i}] has {length} prompt tokens and sampling_params.max_tokens="
                f"{max_tokens}: {length + max_tokens} tokens, over the model's "
                f"max_length={max_length}; ask for max_tokens <= {max_length - length}"
            )


def with_num_samples(params: SamplingParams, num_samples: int | None) -> SamplingParams:
    """``params`` with ``num_samples`` (``sample(num_samples=...)``) when given.

    Raises:
        ValueError: ``params`` already asks for another number of samples.
    """
    if num_samples is None or num_samples == params.num_samples:
        return params
    if params.num_samples != 1:
        raise ValueError(
            f"num_samples={num_samples} but sampling_params.num_samples={params.num_samples}; "
            "give one of them"
        )
    return replace(params, num_samples=num_samples)


def lora_config_dict(config: Any) -> dict[str, Any]:
    """A PEFT ``LoraConfig`` (or its dict) as a dict, checked for a positive rank ``r``."""
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    if not isinstance(config, Mapping):
        raise ArgumentTypeError(
            f"config must be a PEFT LoraConfig or a dict, got {type(config).__name__}"
        )
    rank = config.get("r", 8)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise InvalidArgumentError(f"config.r must be an integer >= 1, got {rank!r}")
    return dict(config)


def _adapter_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"adapter_name must be a non-empty string, got {name!r}")
    return name


def _input_items(inputs: Any) -> list[Any]:
    items = [inputs] if _is_single(inputs) else list(inputs)
    if not items:
        raise InvalidArgumentError("inputs is empty")
    return items


def _prompt_fields(item: Any, prompt: Prompt) -> dict[str, Any]:
    """What each sequence's ``new_input_feature`` keeps of its input: its fields, and for a
    trajectory with images the encoded images its prompt tokens stand for."""
    fields_ = input_fields(item)
    if prompt.has_images and "pixel_values" not in fields_:
        fields_["pixel_values"] = prompt.pixel_values
        fields_["image_grid_thw"] = prompt.image_grid_thw
    return fields_


def _images(item: Mapping) -> tuple[Any, Any]:
    """An encoded input's ``(pixel_values, image_grid_thw)``, both or neither.

    Raises:
        InvalidArgumentError: Only one of the two is given, or their shapes disagree.
    """
    pixels, grid = item.get("pixel_values"), item.get("image_grid_thw")
    if pixels is None and grid is None:
        return None, None
    if pixels is None or grid is None:
        raise InvalidArgumentError(
            "an input with images needs both pixel_values and image_grid_thw"
        )
    pixels = np.asarray(pixels, dtype=np.float32)
    grid = np.asarray(grid, dtype=np.int64).reshape(-1, 3)
    if pixels.ndim != 2 or int(grid.prod(-1).sum()) != pixels.shape[0]:
        raise InvalidArgumentError(
            f"pixel_values has shape {list(pixels.shape)}, image_grid_thw {grid.tolist()} "
            "asks for one row per patch"
        )
    return pixels, grid


def _is_single(inputs: Any) -> bool:
    if isinstance(inputs, (Mapping, Trajectory, np.ndarray)):
        return not (isinstance(inputs, np.ndarray) and inputs.ndim == 2)
    if hasattr(inputs, "dim") and hasattr(inputs, "tolist"):  # a torch tensor
        return inputs.dim() == 1
    if (
        isinstance(inputs, Sequence)
        and inputs
        and all(isinstance(t, (int, np.integer)) for t in inputs)
    ):
        return True
    return False


def _token_list(value: Any) -> list[int]:
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise InvalidArgumentError(
            f"input_ids must be a list of token ids, got {type(value).__name__}"
        )
    tokens = list(value)
    if not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in tokens):
        raise InvalidArgumentError("token ids must be integers")
    return [int(t) for t in tokens]
