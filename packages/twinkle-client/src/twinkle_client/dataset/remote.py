"""``Dataset`` on the server's processor: rows are loaded, preprocessed and encoded server-side."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from twinkle_client._http import DEFAULT_TIMEOUT_S
from twinkle_client._wire import jsonable
from twinkle_client.client import TwinkleClient, get_default_client
from twinkle_client.data_format import InputFeature
from twinkle_client.dataset.meta import DatasetMeta
from twinkle_client.errors import UnsupportedOperationError

if TYPE_CHECKING:
    from twinkle.template import Template

_FETCH_CHUNK = 256


def meta_to_wire(meta: DatasetMeta) -> dict[str, Any]:
    """A ``DatasetMeta`` as JSON (ranges and slices as ``{'range': [start, stop, step]}``)."""
    selection = meta.data_slice
    wire_slice: dict[str, list[Any]] | list[int] | None = None
    if isinstance(selection, range):
        wire_slice = {"range": [selection.start, selection.stop, selection.step]}
    elif isinstance(selection, slice):
        wire_slice = {"slice": [selection.start, selection.stop, selection.step]}
    elif selection is not None:
        wire_slice = [int(i) for i in selection]
    return {
        "dataset_id": meta.dataset_id,
        "subset_name": meta.subset_name,
        "split": meta.split,
        "data_slice": wire_slice,
        "data": None if meta.data is None else jsonable(list(meta.data)),
    }


def encoded_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """An encoded row from the wire: an ``InputFeature``, or for a row of several trajectories
    (``{'positive': ..., 'negative': ...}``) a dict of them."""
    if "input_ids" in row:
        return InputFeature(row)
    return {
        key: InputFeature(value) if isinstance(value, Mapping) and "input_ids" in value else value
        for key, value in row.items()
    }


class Dataset:
    """A dataset held by the server's processor application, with the local class's API.

    Loading, ``map`` and ``encode`` run on the server; items are fetched on access (a
    ``DataLoader`` fetches a whole batch in one request). Only names travel: templates and
    preprocessors are given by registered name, and local files cannot be read by the server
    (send rows with ``DatasetMeta(data=[...])`` instead).

    Args:
        dataset_meta: What to load (a ``DatasetMeta``, or just its ``dataset_id``).

    Attributes:
        client: The :class:`TwinkleClient` used (default: the one ``init_twinkle_client`` made).
    """

    def __init__(self, dataset_meta: DatasetMeta | str) -> None:
        if isinstance(dataset_meta, str):
            dataset_meta = DatasetMeta(dataset_meta)
        self.dataset_meta = dataset_meta
        self.client: TwinkleClient = get_default_client()
        self._template: str | None = None
        self._max_length: int | None = None
        self._encoded = False
        reply = self._call("create_dataset", dataset_meta=meta_to_wire(dataset_meta))
        self._handle: str = reply["dataset"]
        self._update(reply)

    def _call(self, op: str, timeout: float | None = None, **body: Any) -> dict[str, Any]:
        if op != "create_dataset":
            body["dataset"] = self._handle
        return self.client.call(self.client.processor_route, op, body, timeout=timeout)

    def _update(self, reply: dict[str, Any]) -> None:
        self._num_rows = int(reply["num_rows"])
        self._columns = list(reply.get("columns") or [])
        self._encoded = bool(reply.get("encoded", self._encoded))

    def __repr__(self) -> str:
        return (
            f"Dataset({self.dataset_meta.name!r}, rows={len(self)}, "
            f"columns={self._columns}, encoded={self._encoded}, remote=True)"
        )

    @property
    def template(self) -> str | None:
        """The name of the template ``encode`` uses (``None`` until ``set_template``)."""
        return self._template

    @property
    def column_names(self) -> list[str]:
        """The current columns (``input_ids``, ``labels``, ``length`` after ``encode``)."""
        return list(self._columns)

    def set_template(
        self,
        template: str | type[Template] | Template,
        model_id: str | None = None,
        max_length: int | None = None,
        truncation_strategy: str = "raise",
        **kwargs: Any,
    ) -> Dataset:
        """Choose the chat template (by registered name) the server's ``encode`` uses.

        Raises:
            BadRequestError: For an unknown template, model or truncation strategy.
        """
        name = template if isinstance(template, str) else getattr(template, "__name__", None)
        if name is None:
            raise UnsupportedOperationError(
                "a remote dataset takes its template by name (e.g. 'Qwen3_5Template'), not an instance"
            )
        self._update(
            self._call(
                "set_template",
                template=name,
                model_id=model_id,
                max_length=max_length,
                truncation_strategy=truncation_strategy,
                **jsonable(kwargs),
            )
        )
        self._template = name
        self._max_length = max_length
        return self

    def map(
        self,
        preprocessor: str | type | Callable[[Mapping[str, Any]], Any],
        init_args: Mapping[str, Any] | None = None,
        load_from_cache_file: bool = True,
        num_proc: int | None = None,
    ) -> Dataset:
        """Convert every row on the server with a registered preprocessor (by name or class).

        Raises:
            UnsupportedOperationError: For a function or an instance (no code is sent).
            BadRequestError: For an unknown name, or a row missing a field.
        """
        if isinstance(preprocessor, type):
            preprocessor = preprocessor.__name__
        if not isinstance(preprocessor, str):
            raise UnsupportedOperationError(
                "a remote dataset runs only registered preprocessors, given by name with init_args "
                "(e.g. map('SelfCognitionProcessor', init_args={...})): no code is sent to the server. "
                "For a custom function, preprocess locally with twinkle.dataset.Dataset."
            )
        self._update(
            self._call(
                "map",
                preprocessor=preprocessor,
                init_args=jsonable(dict(init_args or {})),
                load_from_cache_file=load_from_cache_file,
                num_proc=num_proc,
            )
        )
        return self

    def filter(
        self,
        fn: str | type | Callable[[Mapping[str, Any]], bool],
        load_from_cache_file: bool = True,
        num_proc: int | None = None,
        init_args: Mapping[str, Any] | None = None,
    ) -> Dataset:
        """Not available remotely: a filter is code, and no code is sent to the server.

        Raises:
            UnsupportedOperationError: Always.
        """
        raise UnsupportedOperationError(
            "Dataset.filter takes a Python function, which a remote dataset cannot run (no code is "
            "sent to the server). Use truncation_strategy='delete' in set_template to drop over-long "
            "samples, filter rows before sending them (DatasetMeta(data=[...])), or use "
            "twinkle.dataset.Dataset locally."
        )

    def encode(
        self,
        batched: bool = True,
        num_proc: int | None = None,
        load_from_cache_file: bool = True,
        timeout: float = DEFAULT_TIMEOUT_S,
        add_generation_prompt: bool = False,
    ) -> Dataset:
        """Tokenise every trajectory with the template, on the server.

        Args:
            batched: Tokenise rows in batches of 1000 rather than one by one.
            num_proc: Server worker processes (capped by the server).
            load_from_cache_file: Reuse the server's cached encoding of the same data.
            timeout: Seconds to wait for the server (600 by default; raise it for big data).
            add_generation_prompt: End each sample with the assistant header (prompts to sample
                from).

        Raises:
            BadRequestError: No template, malformed rows, or over-long samples under ``'raise'``.
            ServerUnavailableError: The server did not finish within ``timeout``.
        """
        body: dict[str, Any] = {
            "batched": batched,
            "num_proc": num_proc,
            "load_from_cache_file": load_from_cache_file,
        }
        if add_generation_prompt:
            body["add_generation_prompt"] = True
        self._update(self._call("encode", timeout=timeout, **body))
        return self

    def __len__(self) -> int:
        return self._num_rows

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Row ``index``: an ``InputFeature`` after ``encode``, otherwise the row dict."""
        if not isinstance(index, int):
            raise TypeError(f"Dataset indices must be int, got {type(index)!r}")
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} rows")
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Many rows in one request (``DataLoader`` uses it for whole batches)."""
        reply = self._call("rows", indices=[int(i) for i in indices])
        if not reply.get("encoded"):
            return [dict(row) for row in reply["rows"]]
        return [encoded_row(row) for row in reply["rows"]]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for start in range(0, len(self), _FETCH_CHUNK):
            yield from self.__getitems__(range(start, min(start + _FETCH_CHUNK, len(self))))
