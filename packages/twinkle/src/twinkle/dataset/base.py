"""``Dataset``: load rows, preprocess them into trajectories, and encode them with a template."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from twinkle._logging import get_logger
from twinkle.dataset._records import read_row
from twinkle.dataset._row_functions import (
    EncodeBatch,
    PreprocessBatch,
    encode_fingerprint,
    keeps,
    paired_columns,
)
from twinkle.dataset._sources import load_source
from twinkle.dataset.meta import DatasetMeta
from twinkle.preprocessor import get_preprocessor
from twinkle.template import Template, get_template

logger = get_logger("twinkle.dataset")


def build_template(
    template: Any, model_id: str | None, max_length: int | None, truncation: str, kwargs: dict
) -> Template:
    """The template ``set_template`` asked for (a name, class or ready instance)."""
    kwargs = {**kwargs, "model_id": model_id, "max_length": max_length}
    kwargs["truncation_strategy"] = truncation
    if isinstance(template, Template):
        # Only arguments the caller actually set are errors for a ready instance.
        kwargs = {k: v for k, v in kwargs.items() if v not in (None, "raise")}
    return get_template(template, **kwargs)


class Dataset:
    """A map-style dataset backed by HF ``datasets`` (memory-mapped, cached, multi-process).

    The usual flow is ``set_template`` -> ``map(preprocessor)`` -> ``encode()``; after ``encode``
    each item is an ``InputFeature`` ready for ``DataLoader``.

    Args:
        dataset_meta: What to load (a ``DatasetMeta``, or just its ``dataset_id``).

    Raises:
        FileNotFoundError: If a local path is missing or a hub dataset is unavailable.

    Example:
        >>> ds = Dataset(dataset_meta=DatasetMeta('builtin://self-cognition', data_slice=range(8)))
        >>> ds.set_template('Qwen3_5Template', model_id='tiny://qwen3.5', max_length=256)
        >>> ds.map('SelfCognitionProcessor', init_args={'model_name': 'Twinkle',
        ...                                           'model_author': 'ModelScope'})
        >>> ds.encode(batched=True)
        >>> ds[0]['input_ids'].shape
    """

    def __init__(self, dataset_meta: DatasetMeta | str) -> None:
        if isinstance(dataset_meta, str):
            dataset_meta = DatasetMeta(dataset_meta)
        self.dataset_meta = dataset_meta
        data = load_source(dataset_meta)
        indices = dataset_meta.slice_indices(len(data))
        if indices is not None:
            data = data.select(indices)
        self._data = data
        self._template: Template | None = None
        self._encoded = False
        # Columns holding one trajectory each (preference rows), encoded one feature each.
        self._paired: tuple[str, ...] | None = None

    def __repr__(self) -> str:
        return (
            f"Dataset({self.dataset_meta.name!r}, rows={len(self)}, "
            f"columns={self._data.column_names}, encoded={self._encoded})"
        )

    @property
    def template(self) -> Template | None:
        """The template ``encode`` uses (``None`` until ``set_template``)."""
        return self._template

    @property
    def hf_dataset(self) -> Any:
        """The underlying ``datasets.Dataset``, for anything this class does not wrap."""
        return self._data

    @property
    def column_names(self) -> list[str]:
        """The current columns (``input_ids``, ``labels``, ``length`` after ``encode``)."""
        return list(self._data.column_names)

    def set_template(
        self,
        template: str | type[Template] | Template,
        model_id: str | None = None,
        max_length: int | None = None,
        truncation_strategy: str = "raise",
        **kwargs: Any,
    ) -> Dataset:
        """Choose the chat template used by ``encode``.

        Args:
            template: A registered name (``'Qwen3_5Template'``), a class, or a built instance.
            model_id: Model whose tokenizer to use, e.g. ``'tiny://qwen3.5'``.
            max_length: Longest sample in tokens; ``None`` for no limit.
            truncation_strategy: ``'raise'``, ``'left'``, ``'right'`` or ``'delete'``.
            **kwargs: Further template arguments (e.g. ``enable_thinking``).

        Raises:
            ValueError: For an unknown template name or truncation strategy.
            TypeError: If arguments are given together with a built instance.
        """
        self._template = build_template(template, model_id, max_length, truncation_strategy, kwargs)
        return self

    def map(
        self,
        preprocessor: str | type | Callable[[Mapping[str, Any]], Any],
        init_args: Mapping[str, Any] | None = None,
        load_from_cache_file: bool = True,
        num_proc: int | None = None,
    ) -> Dataset:
        """Convert every row with a preprocessor; rows it maps to ``None`` are dropped.

        A preprocessor may return one trajectory, a dict of them (``{'positive': ...,
        'negative': ...}``, encoded one feature each), a list (several rows) or ``None``;
        upstream-style batch preprocessors (columns in, columns out) work too.

        Args:
            preprocessor: A registered name, a ``Preprocessor`` class (built with ``init_args``),
                an instance, or any ``row -> dict | Trajectory | None`` callable.
            init_args: Constructor arguments for a name or class.
            load_from_cache_file: Reuse a cached result of the same map when there is one.
            num_proc: Worker processes (``None``: in this process).

        Raises:
            ValueError: For an unknown name, or a row missing a field (the message names the row
                index and the field).
            RuntimeError: If the dataset is already encoded.
        """
        self._check_not_encoded("map")
        fn = get_preprocessor(preprocessor, init_args)
        before = len(self._data)
        self._data = self._data.map(
            PreprocessBatch(fn),
            batched=True,
            with_indices=True,
            remove_columns=self._data.column_names,
            load_from_cache_file=load_from_cache_file,
            num_proc=num_proc,
            desc=f"map {getattr(fn, '__name__', type(fn).__name__)}",
        )
        if len(self._data) != before:
            logger.info("map dropped %d of %d rows", before - len(self._data), before)
        return self

    def filter(
        self,
        fn: str | type | Callable[[Mapping[str, Any]], bool],
        load_from_cache_file: bool = True,
        num_proc: int | None = None,
        init_args: Mapping[str, Any] | None = None,
    ) -> Dataset:
        """Keep the rows (``InputFeature`` items once encoded) for which ``fn`` is true.

        Args:
            fn: Any ``row -> bool`` callable, or a ``DataFilter`` / ``Filter`` (registered name,
                class built with ``init_args``, or instance).
            load_from_cache_file: Reuse a cached result of the same filter when there is one.
            num_proc: Worker processes (``None``: in this process).
            init_args: Constructor arguments for a name or class.
        """
        fn = get_preprocessor(fn, init_args)
        paired, encoded = self._paired, self._encoded
        self._data = self._data.filter(
            lambda row, index: keeps(fn, index, read_row(row, paired, encoded)),
            with_indices=True,
            load_from_cache_file=load_from_cache_file,
            num_proc=num_proc,
        )
        return self

    def encode(
        self,
        batched: bool = True,
        num_proc: int | None = None,
        load_from_cache_file: bool = True,
        timeout: float = 600.0,
        add_generation_prompt: bool = False,
    ) -> Dataset:
        """Tokenise every trajectory with the template.

        A row of several trajectories (``{'positive': ..., 'negative': ...}``) becomes a dict of
        ``InputFeature``s under the same keys; ``user_data`` stays on the encoded row.

        Over-long samples follow the template's ``truncation_strategy``; with ``'delete'`` they
        are removed and the number removed is logged.

        Args:
            batched: Tokenise rows in batches of 1000 (faster) rather than one by one.
            num_proc: Worker processes (``None``: in this process).
            load_from_cache_file: Reuse a cached encoding of the same data and template.
            timeout: The remote call's timeout (``twinkle_client.dataset.Dataset.encode``: seconds
                to wait for the server), accepted so a script runs with either import. Ignored
                here: a local encode runs in this process and is never cut short.
            add_generation_prompt: End each sample with the assistant header, for prompts that
                are sampled from (RL) rather than trained on.

        Raises:
            RuntimeError: If no template is set or it has no tokenizer.
            ValueError: For malformed rows (naming row and field) or over-long samples under
                ``'raise'``.
        """
        self._check_not_encoded("encode")
        template = self._require_template()
        paired = paired_columns(self._data[0]) if len(self._data) else None
        if len(self._data) and "messages" not in self._data.column_names and not paired:
            raise ValueError(
                f"row 0: missing field 'messages' (columns: {self._data.column_names}); "
                "convert rows with map(preprocessor) first"
            )
        before = len(self._data)
        self._data = self._data.map(
            EncodeBatch(template, add_generation_prompt),
            batched=True,
            batch_size=1000 if batched else 1,
            with_indices=True,
            remove_columns=self._data.column_names,
            load_from_cache_file=load_from_cache_file,
            num_proc=num_proc,
            new_fingerprint=encode_fingerprint(
                self._data._fingerprint, template, add_generation_prompt
            ),
            desc="encode",
        )
        self._encoded = True
        self._paired = paired
        dropped = before - len(self._data)
        if dropped:
            logger.info(
                "encode dropped %d of %d samples longer than max_length=%s "
                "(truncation_strategy='delete')",
                dropped,
                before,
                template.max_length,
            )
        return self

    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Row ``index``: an ``InputFeature`` after ``encode`` (a dict of them for paired rows),
        otherwise the row dict."""
        if not isinstance(index, int):
            raise TypeError(f"Dataset indices must be int, got {type(index)!r}")
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} rows")
        return self._wrap(self._data[index])

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Many rows in one read (``DataLoader`` uses it for whole batches)."""
        columns = self._data[list(indices)]
        return [self._wrap(dict(zip(columns, values))) for values in zip(*columns.values())]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for row in self._data:
            yield self._wrap(row)

    def _wrap(self, row: dict[str, Any]) -> dict[str, Any]:
        return read_row(row, self._paired, self._encoded)

    def _require_template(self) -> Template:
        if self._template is None:
            raise RuntimeError(
                "no template: call set_template('Qwen3_5Template', model_id=...) first"
            )
        self._template.tokenizer  # noqa: B018 - load once here, not in every worker process
        return self._template

    def _check_not_encoded(self, what: str) -> None:
        if self._encoded:
            raise RuntimeError(f"cannot {what}: the dataset is already encoded")
