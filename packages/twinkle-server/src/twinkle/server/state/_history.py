"""Training history of every run, kept with the run in the state store.

- The model service notes each call's figures (:class:`RunHistory`, on the model thread, no
  store call): ``forward_backward`` results add up, and an optimizer step closes them into one
  :class:`~twinkle_client.tracking.HistoryPoint` (loss, tokens, learning rate, gradient norm,
  the loss's metrics, step time). Native and Tinker calls go through the same path.
- A :class:`HistoryWriter` thread appends the points to the store, at most one write per run
  every :data:`WRITE_INTERVAL_S`, so a slow store never slows training.
- :class:`HistoryMixin` stores them per run in blocks, bounded and thinned as
  :mod:`twinkle_client.tracking.history` says, and reads them back for the run's owner only.

The replica holding a run's adapter is the only writer of its history.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from twinkle.server.state._base import StateBase
from twinkle.server.state.errors import BadRequestError, NotFoundError
from twinkle_client.tracking.history import (
    BLOCK_POINTS,
    MAX_BLOCKS,
    HistoryPoint,
    StepAccumulator,
    TrainingHistory,
    merge_oldest,
)

logger = logging.getLogger("twinkle.server.history")

HISTORY, HISTORY_BLOCK = "history/", "history_block/"
WRITE_INTERVAL_S = 0.5


def _block_key(run_id: str, number: int) -> str:
    return f"{HISTORY_BLOCK}{run_id}/{number:08d}"


class HistoryMixin(StateBase):
    """Per-run training history: an index record (``history/<run>``) holding the newest points
    (the open block, up to :data:`BLOCK_POINTS`) and naming the full blocks before them
    (``history_block/<run>/<n>``). A step costs one read and one write of the index; a block
    is written when it fills, and the two oldest merged past the bound."""

    def append_history(self, owner: str, run_id: str, points: list[HistoryPoint]) -> None:
        """Append ``points`` to ``owner``'s run, then thin its oldest blocks past the bound."""
        index = self.store.get(HISTORY + run_id) or {
            "owner": owner,
            "run_id": run_id,
            "blocks": [],  # full blocks' numbers, oldest first
            "next_block": 0,
            "open": [],  # the newest points
            "recorded": 0,
            "thinned": False,
        }
        if index.get("owner") != owner:
            raise NotFoundError("training run not found")
        index["open"] += [p.model_dump(mode="json", exclude_defaults=True) for p in points]
        index["recorded"] += len(points)
        blocks = index["blocks"]
        while len(index["open"]) >= BLOCK_POINTS:
            full, index["open"] = index["open"][:BLOCK_POINTS], index["open"][BLOCK_POINTS:]
            self._put_block(owner, run_id, index["next_block"], full)
            blocks.append(index["next_block"])
            index["next_block"] += 1
        doomed = []
        while len(blocks) >= MAX_BLOCKS:  # the open block counts as one
            first, second = blocks[0], blocks[1]
            merged = merge_oldest(*(self._block_points(run_id, n) for n in (first, second)))
            self._put_block(owner, run_id, second, merged)
            blocks.pop(0)
            doomed.append(first)
            index["thinned"] = True
        self.store.put(HISTORY + run_id, index)
        for number in doomed:  # after the index stops naming them
            self.store.delete(_block_key(run_id, number))

    def get_training_history(
        self, owner: str, run_id: str, since_step: int | None = None
    ) -> TrainingHistory:
        """``owner``'s run's history (points after ``since_step`` only, when given).

        Raises:
            NotFoundError: No such run of ``owner`` (another owner's run included).
            BadRequestError: ``since_step`` is not an integer.
        """
        run = self.get_run(owner, run_id)  # type: ignore[attr-defined]
        return self.stored_history(run.training_run_id, since_step)

    def stored_history(self, run_id: str, since_step: int | None = None) -> TrainingHistory:
        """The history of ``run_id``, whoever owns it (the operator's export)."""
        if since_step is not None and (
            isinstance(since_step, bool) or not isinstance(since_step, int)
        ):
            raise BadRequestError(f"since_step must be an integer, got {since_step!r}")
        index = self.store.get(HISTORY + self._text_id(run_id, "run_id"))
        if index is None:
            return TrainingHistory(run_id=run_id)
        rows = list(index["open"])
        if since_step is None:  # every block, in one scan
            stored = dict(self.store.scan(f"{HISTORY_BLOCK}{run_id}/"))
            named = [stored.get(_block_key(run_id, n), {}) for n in index["blocks"]]
            rows = [row for block in named for row in block.get("points", [])] + rows
        else:  # newest first, as far back as since_step: a poll reads the index alone
            for number in reversed(index["blocks"]):
                if rows and rows[0]["step"] <= since_step:
                    break
                rows = self._block_points(run_id, number) + rows
        points = [HistoryPoint.model_validate(row) for row in rows]
        return TrainingHistory(
            run_id=run_id,
            points=[p for p in points if since_step is None or p.step > since_step],
            recorded=index["recorded"],
            thinned=index["thinned"],
            max_points=MAX_BLOCKS * BLOCK_POINTS,
        )

    def _put_block(self, owner: str, run_id: str, number: int, rows: list) -> None:
        self.store.put(_block_key(run_id, number), {"owner": owner, "points": rows})

    def _block_points(self, run_id: str, number: int) -> list[dict[str, Any]]:
        return (self.store.get(_block_key(run_id, number)) or {}).get("points", [])


class HistoryWriter:
    """A daemon thread that appends noted points to the store, in order, batching per run.

    Args:
        state: The :class:`~twinkle.server.state.ServerState`.
        interval_s: Least time between two writes of the thread.
    """

    def __init__(self, state: Any, interval_s: float = WRITE_INTERVAL_S) -> None:
        self.state, self.interval_s = state, interval_s
        self._queue: list[tuple[str, str, HistoryPoint]] = []
        self._cond = threading.Condition()
        self._submitted = self._written = 0
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="history-writer", daemon=True)
        self._thread.start()

    def submit(self, owner: str, run_id: str, point: HistoryPoint) -> None:
        with self._cond:
            self._queue.append((owner, run_id, point))
            self._submitted += 1
            self._cond.notify_all()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every point submitted so far is written; ``False`` on timeout."""
        with self._cond:
            target = self._submitted
            self._wake.set()
            return self._cond.wait_for(lambda: self._written >= target, timeout)

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._queue))
                taken, self._queue = self._queue, []
            by_run: dict[tuple[str, str], list[HistoryPoint]] = {}
            for owner, run_id, point in taken:
                by_run.setdefault((owner, run_id), []).append(point)
            for (owner, run_id), points in by_run.items():
                try:
                    self.state.append_history(owner, run_id, points)
                except Exception:  # noqa: BLE001 - a lost point must not stop the others
                    logger.exception(
                        "could not store %d history points of run %s", len(points), run_id
                    )
            with self._cond:
                self._written += len(taken)
                self._cond.notify_all()
            self._wake.wait(self.interval_s)
            self._wake.clear()


class RunHistory:
    """What the model service records for its adapters' runs.

    Args:
        state: The server state (``None``: nothing is recorded, e.g. a registry without one).
        model: The backend; where a step's result lacks the learning rate or gradient norm
            (``clip_grad_and_step``, ``step``), they are read from the backend's own
            ``get_training_history`` when it has one.
        clock: The service's clock.
    """

    def __init__(self, state: Any, model: Any, clock: Callable[[], float]) -> None:
        self.model, self.clock = model, clock
        self.writer = HistoryWriter(state) if state is not None else None

    def note(self, entry: Any, operation: Any, result: Any) -> None:
        """After one call of ``entry``'s adapter: add a training call's figures, or close them
        into a point when the call took an optimizer step."""
        if self.writer is None:
            return
        if entry.history is None:
            entry.history = StepAccumulator()
        pending: StepAccumulator = entry.history
        if operation.trains and isinstance(result, dict) and operation.name != "forward":
            pending.add(result.get("loss"), result.get("num_tokens"), result.get("metrics"))
        elif operation.steps and result is not False:
            figures = _step_figures(result)
            backend = self._backend_point(entry.internal, pending)
            if backend is not None:
                figures = {**backend, **{k: v for k, v in figures.items() if v is not None}}
            point = pending.close(
                int(figures.get("step") or pending.last_step + 1),
                figures.get("learning_rate"),
                figures.get("grad_norm"),
                now=self.clock(),
            )
            self.writer.submit(entry.owner, entry.run_id, point)

    def _backend_point(self, internal: str, pending: StepAccumulator) -> dict[str, Any] | None:
        read = getattr(self.model, "get_training_history", None)
        if read is None:
            return None
        try:
            points = read(adapter_name=internal, since_step=pending.last_step).points
        except Exception:  # noqa: BLE001 - the figures are optional; the step happened
            return None
        if not points:
            return None
        last = points[-1]
        return {"step": last.step, "learning_rate": last.learning_rate, "grad_norm": last.grad_norm}


def _step_figures(result: Any) -> dict[str, Any]:
    """Step, learning rate and gradient norm as a step's result reports them: the native
    ``optim_step`` (``{'grad_norm', 'learning_rate', 'step'}``) or Tinker's
    (``{'metrics': {'grad_norm:mean', 'learning_rate:mean', 'step:max'}}``)."""
    if not isinstance(result, dict):
        return {}
    metrics = result.get("metrics") if isinstance(result.get("metrics"), dict) else {}
    figures = {
        "step": result.get("step", metrics.get("step:max")),
        "learning_rate": result.get("learning_rate", metrics.get("learning_rate:mean")),
        "grad_norm": result.get("grad_norm", metrics.get("grad_norm:mean")),
    }
    return {k: v if isinstance(v, (int, float)) else None for k, v in figures.items()}


def history_reply(state: Any, owner: str, run_id: str, since_step: int | None) -> dict:
    """The ``GET /training_runs/{run_id}/history`` answer."""
    return state.get_training_history(owner, run_id, since_step).model_dump(mode="json")


def export_stored_history(persistence: Any, run_id: str, to: str, path: str) -> int:
    """Write a run's stored history to a tracker (``twinkle-server export-history``); returns
    the number of points. Reads the store the server config names (file or Redis).

    Raises:
        NotFoundError: The store holds no history of ``run_id``.
    """
    from twinkle.server.state.factory import create_store
    from twinkle_client.tracking import export_history, make_tracker

    store = create_store(persistence)
    try:
        history = HistoryMixin(store).stored_history(run_id)
    finally:
        store.close()
    if not history.points:
        raise NotFoundError(f"no training history of run {run_id!r} in this store")
    return export_history(history, make_tracker(to, path=path))
