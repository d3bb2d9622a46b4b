"""``record_stability_info``: the sampler's own per-token logprobs, kept per sampled
``sequence_id`` so that a later ``stable_reinforce`` step can weigh each token against exactly
what the sampler saw.

A datum names its sources with provenance spans (``Datum.with_provenance``): its
``loss_fn_input_spans`` tile the target positions, and a ``SampledProvenanceSpan`` claims that
its positions are tokens ``[offset, offset + length)`` of a recorded sequence. Those positions get
the recorded logprobs as ``logprobs`` and ``weights`` 1; every other position gets weight 0.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from twinkle.server.web.errors import BadRequest

MAX_SEQUENCES = 200_000


@dataclass(frozen=True)
class SequenceRecord:
    tokens: np.ndarray  # int64, the sampled tokens
    logprobs: np.ndarray  # float32, the sampler's logprob of each


class StabilityStore:
    """Recorded sequences per ``(owner, sequence_id)``, the oldest dropped beyond ``max_sequences``."""

    def __init__(self, max_sequences: int = MAX_SEQUENCES) -> None:
        self.max_sequences = max_sequences
        self._records: OrderedDict[tuple[str, str], SequenceRecord] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, owner: str, sequence_id: str, tokens: Any, logprobs: Any) -> None:
        record = SequenceRecord(
            np.asarray(tokens, dtype=np.int64), np.asarray(logprobs, dtype=np.float32)
        )
        with self._lock:
            self._records[(owner, sequence_id)] = record
            self._records.move_to_end((owner, sequence_id))
            while len(self._records) > self.max_sequences:
                self._records.popitem(last=False)

    def get(self, owner: str, sequence_id: str) -> SequenceRecord | None:
        with self._lock:
            return self._records.get((owner, sequence_id))


_STORES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def store_for(api: Any) -> StabilityStore:
    """The store of one Tinker API instance (created on first use)."""
    store = _STORES.get(api)
    if store is None:
        store = _STORES.setdefault(api, StabilityStore())
    return store


def record_samples(
    store: StabilityStore, owner: str, sequence_ids: list[str], sequences: list[dict]
) -> None:
    for sequence_id, seq in zip(sequence_ids, sequences):
        store.record(owner, sequence_id, seq.get("tokens") or [], seq.get("logprobs") or [])


def _loss_spans(body: bytes) -> list[list[tuple[str, str, int, int]]]:
    """Per datum, its ``loss_fn_input_spans`` as ``(kind, sequence_id, offset, length)``."""
    from tinker.proto import tinker_public_pb2

    msg = tinker_public_pb2.ForwardBackwardRequest()
    msg.ParseFromString(body)
    out = []
    for datum in msg.data:
        spans = []
        for span in datum.loss_fn_input_spans:
            kind = span.WhichOneof("span")
            arm = getattr(span, kind)
            spans.append((kind, arm.sequence_id, int(arm.offset), int(arm.length)))
        out.append(spans)
    return out


def bind_sampler_logprobs(store: StabilityStore, owner: str, data: list, body: bytes) -> None:
    """Set each datum's ``logprobs`` to the recorded sampler logprobs and ``weights`` to its
    sampled positions, from its provenance spans.

    Raises:
        BadRequest: a datum without provenance, spans that do not tile its targets, a sequence
            not recorded (sampled without ``record_stability_info``, or expired), or targets that
            are not the recorded tokens.
    """
    for i, (datum, spans) in enumerate(zip(data, _loss_spans(body))):
        targets = datum.inputs.get("target_tokens")
        n = 0 if targets is None else targets.shape[0]
        if not spans:
            raise BadRequest(
                f"data[{i}]: loss_fn 'stable_reinforce' needs provenance spans naming the sampled "
                "sequences (Datum.with_provenance)"
            )
        if sum(length for *_, length in spans) != n:
            raise BadRequest(f"data[{i}]: loss_fn_input_spans do not cover its {n} targets")
        logprobs_T = np.zeros(n, dtype=np.float32)
        weights_T = np.zeros(n, dtype=np.float32)
        start = 0
        for kind, sequence_id, offset, length in spans:
            if kind == "sampled_tokens" and length:
                record = _record(store, owner, sequence_id, i)
                if offset + length > record.tokens.shape[0]:
                    raise BadRequest(
                        f"data[{i}]: span [{offset}, {offset + length}) is past the "
                        f"{record.tokens.shape[0]} tokens of sequence {sequence_id!r}"
                    )
                want = record.tokens[offset : offset + length]
                if not np.array_equal(targets[start : start + length].astype(np.int64), want):
                    raise BadRequest(
                        f"data[{i}]: target_tokens at [{start}, {start + length}) are not the "
                        f"sampled tokens of sequence {sequence_id!r}"
                    )
                logprobs_T[start : start + length] = record.logprobs[offset : offset + length]
                weights_T[start : start + length] = 1.0
            start += length
        datum.inputs["logprobs"] = logprobs_T
        datum.inputs["weights"] = weights_T


def _record(store: StabilityStore, owner: str, sequence_id: str, i: int) -> SequenceRecord:
    record = store.get(owner, sequence_id)
    if record is None:
        raise BadRequest(
            f"data[{i}]: sequence {sequence_id!r} has no stability record; sample it with "
            "record_stability_info=True (save_weights_and_get_sampling_client"
            "(record_stability_info=True)) shortly before training on it"
        )
    return record
