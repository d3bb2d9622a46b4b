"""``TwinkleClient``: the connection to a Twinkle server, its session and the management API.

``init_twinkle_client(...)`` builds one and makes it the process default, so remote classes
(``twinkle_client.model.MultiLoraTransformersModel(model_id=...)``) find it without being told.
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import Any

from twinkle_client._http import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_MAX_RETRIES,
    DEFAULT_TIMEOUT_S,
    HttpTransport,
    NotConnectedError,
)
from twinkle_client._version import __version__
from twinkle_client.env import TWINKLE_CLIENT_DIRECT, TWINKLE_SERVER_TOKEN, TWINKLE_SERVER_URL
from twinkle_client.errors import NotFoundError, TwinkleClientError
from twinkle_client.tracking.history import TrainingHistory
from twinkle_client.types import (
    DEFAULT_GATEWAY,
    CapacityInfo,
    Checkpoint,
    Cursor,
    DeleteCheckpointResponse,
    RouteTable,
    ServerCapabilities,
    TrainingRun,
    WeightsInfo,
)

logger = logging.getLogger("twinkle_client")

API_PREFIX = DEFAULT_GATEWAY
DEFAULT_BASE_URL = "http://127.0.0.1:8000"
DIRECT_CONNECT_TIMEOUT_S = 2.0  # a replica address that does not connect this fast is not used
HEARTBEAT_INTERVAL_S = 10.0
_SCHEMES = ("ms://", "hf://", "modelscope://", "huggingface://")

_default_client: TwinkleClient | None = None
_default_lock = threading.Lock()


def served_model_name(model_id: str) -> str:
    """The name a server serves ``model_id`` under (``ms://Qwen/Qwen3.5-4B`` -> ``Qwen/Qwen3.5-4B``,
    ``tiny://qwen3.5`` -> ``tiny/qwen3.5``, ``Qwen/Qwen3.5-4B`` unchanged)."""
    if model_id.startswith("tiny://"):
        return "tiny/" + model_id.removeprefix("tiny://")
    for scheme in _SCHEMES:
        if model_id.startswith(scheme):
            return model_id.removeprefix(scheme)
    if model_id.startswith(("/", "./", "../", "~")):
        return model_id.rstrip("/").rsplit("/", 1)[-1]
    return model_id


class TwinkleClient:
    """A connection to one Twinkle server under one API key.

    On creation it opens a server session and heartbeats it every ``heartbeat_interval_s`` from
    a daemon thread, so adapters created through it stay loaded; :meth:`close` (also called at
    interpreter exit and by ``with``) removes those adapters (their checkpoints stay), stops the
    heartbeat and finishes the session, so a script can simply be run again.

    Args:
        base_url: Server address; ``$TWINKLE_SERVER_URL`` or ``http://127.0.0.1:8000``.
        api_key: API key; ``$TWINKLE_SERVER_TOKEN`` when not given.
        timeout: Seconds one call may take once connected (training steps, ``encode``).
        max_retries: Retries of 429/503 answers (exponential backoff, ``Retry-After`` honoured).
        connect_timeout: Seconds to wait for a connection before reporting the server down.
        heartbeat_interval_s: Seconds between session heartbeats; ``None`` opens no session.
        transport: An ``httpx`` transport, for tests.
        direct: Send a model's training calls straight to its replica when the server offers an
            address for it (``GET <model>/endpoint``; Ray Serve's direct ingress), falling back
            to the main address if that cannot be reached. Default: on unless
            ``TWINKLE_CLIENT_DIRECT=0`` or a custom ``transport`` is given.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        max_retries: int = DEFAULT_MAX_RETRIES,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
        heartbeat_interval_s: float | None = HEARTBEAT_INTERVAL_S,
        transport: Any = None,
        direct: bool | None = None,
    ) -> None:
        self.base_url = (base_url or TWINKLE_SERVER_URL.get() or DEFAULT_BASE_URL).rstrip("/")
        self.api_key = api_key or TWINKLE_SERVER_TOKEN.get() or None
        self.http = HttpTransport(
            self.base_url,
            self.api_key,
            timeout=timeout,
            connect_timeout=connect_timeout,
            max_retries=max_retries,
            transport=transport,
        )
        if direct is None:
            direct = transport is None and TWINKLE_CLIENT_DIRECT.get()
        self._direct = direct
        self._timeouts = (timeout, min(connect_timeout, DIRECT_CONNECT_TIMEOUT_S))
        self._max_retries = max_retries
        self._routes: dict[str, HttpTransport] = {}  # model route -> where its calls go
        self._routes_lock = threading.Lock()
        self._route_table: RouteTable | None = None
        self._route_table_lock = threading.Lock()
        self.session_id: str | None = None
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._closed = False
        self._adapters: set[tuple[str, str]] = set()  # (model route, adapter name) made here
        if heartbeat_interval_s is not None:
            self._open_session(heartbeat_interval_s)
        atexit.register(self.close)

    # ------------------------------------------------------------------ lifecycle
    def _open_session(self, interval_s: float) -> None:
        reply = self.http.post(
            f"{API_PREFIX}/create_session", {"sdk_version": f"twinkle-client/{__version__}"}
        )
        self.session_id = reply["session_id"]
        self._heartbeat = threading.Thread(
            target=self._heartbeat_loop, args=(interval_s,), name="twinkle-heartbeat", daemon=True
        )
        self._heartbeat.start()

    def _heartbeat_loop(self, interval_s: float) -> None:
        failures = 0
        while not self._stop.wait(interval_s):
            try:
                self.http.post(
                    f"{API_PREFIX}/session_heartbeat",
                    {"session_id": self.session_id},
                    timeout=10.0,
                    retries=0,
                )
                failures = 0
            except TwinkleClientError as exc:
                failures += 1
                if failures == 1:
                    logger.warning("session heartbeat failed (will keep trying): %s", exc)

    def track_adapter(self, route: str, adapter_name: str, alive: bool = True) -> None:
        """Record (or forget) an adapter created through this client, for :meth:`close`."""
        (self._adapters.add if alive else self._adapters.discard)((route, adapter_name))

    def close(self) -> None:
        """Remove the adapters created through this client, stop heartbeating, finish the
        session and release the connection (idempotent). Checkpoints are kept."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5)
        for route, name in sorted(self._adapters):
            try:
                self.http.post(
                    f"{route}/remove_adapter", {"adapter_name": name}, timeout=30.0, retries=0
                )
            except TwinkleClientError:
                pass  # already gone, or the server unloads it when the session expires
        if self.session_id is not None:
            try:
                self.http.post(
                    f"{API_PREFIX}/sessions/{self.session_id}/finish", timeout=5.0, retries=0
                )
            except TwinkleClientError:
                pass  # the server expires sessions that stop heartbeating anyway
        for transport in set(self._routes.values()) - {self.http}:
            transport.close()
        self.http.close()
        atexit.unregister(self.close)

    def __enter__(self) -> TwinkleClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TwinkleClient(base_url={self.base_url!r}, session_id={self.session_id!r})"

    # ------------------------------------------------------------------ management
    def health_check(self) -> bool:
        """``True`` when the server answers; raises :class:`ServerUnavailableError` otherwise."""
        return self.http.get(f"{API_PREFIX}/healthz", retries=0).get("status") == "ok"

    def get_server_capabilities(self) -> ServerCapabilities:
        """The base models the server serves (``.supported_models``, each with ``.model_name``)."""
        return ServerCapabilities.model_validate(
            self.http.get(f"{API_PREFIX}/get_server_capabilities")
        )

    def get_capacity_info(self) -> CapacityInfo:
        """Adapter slots: ``max_loras``, ``used_loras`` and ``free_loras`` over the server's
        trainable base models, and the same per base model in ``models``."""
        return CapacityInfo.model_validate(self.http.get(f"{API_PREFIX}/capacity_info"))

    def list_training_runs(
        self, limit: int = 20, offset: int = 0, all_users: bool = False
    ) -> list[TrainingRun]:
        """This API key's training runs, newest first.

        Args:
            limit: Runs per page.
            offset: Runs to skip.
            all_users: Ask for every key's runs. The server answers with this key's runs only
                (it has no administrator keys: no key sees another key's runs).
        """
        return self.list_training_runs_with_cursor(limit, offset, all_users)[0]

    def list_training_runs_with_cursor(
        self, limit: int = 20, offset: int = 0, all_users: bool = False
    ) -> tuple[list[TrainingRun], Cursor]:
        """One page of :meth:`list_training_runs` and where it sits (``cursor.total_count``)."""
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if all_users:
            params["all_users"] = "true"
        reply = self.http.get(f"{API_PREFIX}/training_runs", params=params)
        runs = [TrainingRun.model_validate(run) for run in reply["training_runs"]]
        return runs, Cursor.model_validate(reply.get("cursor") or {})

    def find_training_run_by_model(self, base_model: str) -> list[TrainingRun]:
        """This key's runs on ``base_model`` (``Qwen/Qwen3.5-4B``, ``ms://Qwen/Qwen3.5-4B`` or
        ``tiny://qwen3.5``), newest first."""
        wanted = served_model_name(base_model)
        found: list[TrainingRun] = []
        offset, page = 0, 1000
        while True:
            runs, cursor = self.list_training_runs_with_cursor(limit=page, offset=offset)
            found += [r for r in runs if r.base_model == wanted]
            offset += len(runs)
            if not runs or offset >= cursor.total_count:
                return found

    def get_training_run(self, run_id: str) -> TrainingRun:
        """One training run; raises :class:`NotFoundError` for another key's or an unknown run."""
        return TrainingRun.model_validate(self.http.get(f"{API_PREFIX}/training_runs/{run_id}"))

    def list_checkpoints(self, run_id: str) -> list[Checkpoint]:
        """The checkpoints of a run, in the order they were saved."""
        reply = self.http.get(f"{API_PREFIX}/training_runs/{run_id}/checkpoints")
        return [Checkpoint.model_validate(c) for c in reply["checkpoints"]]

    def get_checkpoint_path(self, run_id: str, checkpoint_id: str) -> str:
        """The ``twinkle://`` path of checkpoint ``checkpoint_id`` (e.g. ``weights/epoch-1`` or
        just ``epoch-1``) of a run."""
        for checkpoint in self.list_checkpoints(run_id):
            if checkpoint_id in (
                checkpoint.checkpoint_id,
                checkpoint.checkpoint_id.split("/", 1)[-1],
            ):
                return checkpoint.twinkle_path
        raise NotFoundError(f"run {run_id!r} has no checkpoint {checkpoint_id!r}", status=404)

    def delete_checkpoint(self, run_id: str, checkpoint_id: str) -> DeleteCheckpointResponse:
        """Delete one of this key's checkpoints, files included.

        Args:
            run_id: The training run.
            checkpoint_id: ``weights/<name>``, ``sampler_weights/<name>`` or just ``<name>``
                (looked up among the run's checkpoints).

        Raises:
            NotFoundError: No such checkpoint of this key.
        """
        if "/" not in checkpoint_id:
            path = self.get_checkpoint_path(run_id, checkpoint_id)
            checkpoint_id = path.split(f"{run_id}/", 1)[1]
        reply = self.http.request(
            "DELETE", f"{API_PREFIX}/training_runs/{run_id}/checkpoints/{checkpoint_id}"
        )
        return DeleteCheckpointResponse(
            success=True, message=f"deleted {reply['deleted']}", twinkle_path=reply["deleted"]
        )

    def get_weights_info(self, twinkle_path: str) -> WeightsInfo:
        """What the checkpoint at ``twinkle_path`` holds: its run, base model, owner and LoRA
        rank (this key's checkpoints and published ones only).

        Raises:
            NotFoundError: Not a checkpoint this key can read.
        """
        return WeightsInfo.model_validate(
            self.http.get(f"{API_PREFIX}/checkpoint_info", params={"twinkle_path": twinkle_path})
        )

    def get_training_history(self, run_id: str, since_step: int | None = None) -> TrainingHistory:
        """The run's per-step figures as the server recorded them (a
        :class:`~twinkle_client.tracking.TrainingHistory`), after ``since_step`` if given.

        Raises:
            NotFoundError: Another key's or an unknown run.
        """
        params = {} if since_step is None else {"since_step": since_step}
        reply = self.http.get(f"{API_PREFIX}/training_runs/{run_id}/history", params=params)
        return TrainingHistory.model_validate(reply)

    def export_history(self, run_id: str, to: str, path: Any = None, **kwargs: Any) -> int:
        """Send the run's stored history to a tracker (``tensorboard``, ``wandb``, ``mlflow``,
        ``swanlab``; ``path``: where it writes, ``kwargs``: the tracker's options, see
        :func:`twinkle_client.tracking.make_tracker`); returns the number of points."""
        from twinkle_client.tracking import export_history, make_tracker

        history = self.get_training_history(run_id)
        return export_history(history, make_tracker(to, path=path, **kwargs))

    def get_latest_checkpoint_path(self, run_id: str) -> str | None:
        """The ``twinkle://`` path of the run's most recent training checkpoint (``None`` if none)."""
        checkpoints = self.list_checkpoints(run_id)
        training = [c for c in checkpoints if c.checkpoint_type != "sampler"] or checkpoints
        if not training:
            return None
        return max(enumerate(training), key=lambda ic: (ic[1].time or "", ic[0]))[1].twinkle_path

    # ------------------------------------------------------------------ deployments
    def model(self, model_id: str, **kwargs: Any) -> Any:
        """A remote ``MultiLoraTransformersModel`` of ``model_id`` on this client's server."""
        from twinkle_client.model import MultiLoraTransformersModel

        return MultiLoraTransformersModel(model_id, client=self, **kwargs)

    def sampler(self, model_id: str, **kwargs: Any) -> Any:
        """A remote ``vLLMSampler`` of ``model_id`` on this client's server."""
        from twinkle_client.sampler import vLLMSampler

        sampler = vLLMSampler(model_id, **kwargs)
        sampler.client = self
        return sampler

    def get_routes(self) -> RouteTable:
        """Where the server's model, sampler and processor applications answer.

        Asked once (``GET /api/v1/routes``) and kept; a server that publishes no table (an older
        version) gets :meth:`RouteTable.default_layout`.
        """
        if self._route_table is None:
            with self._route_table_lock:
                if self._route_table is None:
                    self._route_table = self._fetch_routes()
        return self._route_table

    def _fetch_routes(self) -> RouteTable:
        try:
            reply = self.http.get(f"{API_PREFIX}/routes")
        except NotFoundError:
            return RouteTable.default_layout()
        if not isinstance(reply, dict) or "models" not in reply:
            return RouteTable.default_layout()
        return RouteTable.model_validate(reply)

    def model_route(self, model_id: str) -> str:
        """The route prefix of the model application training ``model_id``.

        Raises:
            NotFoundError: The server trains no such base model (the message lists those it does).
        """
        return self.get_routes().model_route(served_model_name(model_id))

    def sampler_route(self, model_id: str) -> str:
        """The route prefix of the sampler application of ``model_id``.

        Raises:
            NotFoundError: The server samples no such base model.
        """
        return self.get_routes().sampler_route(served_model_name(model_id))

    @property
    def processor_route(self) -> str:
        """The route prefix of the processor application (remote datasets)."""
        return self.get_routes().processor_route()

    def call(self, route: str, op: str, body: dict[str, Any], timeout: float | None = None) -> Any:
        """``POST <route>/<op>`` and return the reply's ``result``.

        A model's calls go straight to its replica when the server offers its address (see
        ``direct``); if that address stops answering (the replica moved), the call goes to the
        main address (nothing was sent) and the address is looked up again next time.
        """
        transport = self._transport(route)
        try:
            return non_finite_floats(
                transport.post(f"{route}/{op}", body, timeout=timeout)["result"]
            )
        except NotConnectedError:
            if transport is self.http:
                raise
            self._routes.pop(route, None)
            transport.close()
            return non_finite_floats(
                self.http.post(f"{route}/{op}", body, timeout=timeout)["result"]
            )

    def _transport(self, route: str) -> HttpTransport:
        transport = self._routes.get(route)
        if transport is None:
            with self._routes_lock:  # threads of one script share one lookup
                transport = self._routes.get(route)
                if transport is None:
                    transport = self._direct_transport(route) or self.http
                    self._routes[route] = transport
        return transport

    def _direct_transport(self, route: str) -> HttpTransport | None:
        """A connection to the replica serving ``route`` itself, if it offers one we can reach."""
        if not self._direct or not self.get_routes().is_model_route(route):
            return None
        try:
            url = (self.http.get(f"{route}/endpoint", retries=0) or {}).get("direct_url")
        except TwinkleClientError:  # an older server, or none: the main address it is
            return None
        if not url or url.rstrip("/") == self.base_url:
            return None
        timeout, connect_timeout = self._timeouts
        direct = HttpTransport(
            url,
            self.api_key,
            timeout=timeout,
            connect_timeout=connect_timeout,
            max_retries=self._max_retries,
        )
        try:
            direct.get(f"{route}/healthz", retries=0)
        except TwinkleClientError:  # e.g. behind NAT or a firewall: keep the main address
            direct.close()
            logger.info("model %s offers %s, which does not answer here; using %s",
                        route, url, self.base_url)  # fmt: skip
            return None
        logger.debug("model %s: calls go to %s", route, url)
        return direct

    def export_merged(self, checkpoint_path: str, out_dir: Any, **kwargs: Any) -> Any:
        """The checkpoint merged into its base model, downloaded into ``out_dir`` (a Hugging
        Face model directory); see :func:`twinkle_client.export.export_merged`."""
        from twinkle_client.export import export_merged

        return export_merged(self, checkpoint_path, out_dir, **kwargs)

    def publish_merged(self, checkpoint_path: str, repo_id: str, **kwargs: Any) -> dict:
        """Merge and upload to ``repo_id`` (``hub="hf"|"ms"``, ``token=...``); see
        :func:`twinkle_client.export.publish_merged`."""
        from twinkle_client.export import publish_merged

        return publish_merged(self, checkpoint_path, repo_id, **kwargs)


def init_twinkle_client(
    base_url: str | None = None,
    api_key: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    max_retries: int = DEFAULT_MAX_RETRIES,
    **kwargs: Any,
) -> TwinkleClient:
    """Connect to a Twinkle server and make the connection the process default.

    Args:
        base_url: Server address; ``$TWINKLE_SERVER_URL`` or ``http://127.0.0.1:8000``.
        api_key: API key; ``$TWINKLE_SERVER_TOKEN`` when not given.
        timeout: Seconds one call may take once connected (default 600).
        max_retries: Retries of 429/503 answers with exponential backoff.
        **kwargs: Further :class:`TwinkleClient` arguments (``connect_timeout``, ...).

    Returns:
        The client; remote models, samplers and datasets created afterwards use it.

    Raises:
        ServerUnavailableError: The server cannot be reached (the message names the URL).
        AuthenticationError: The API key is missing or not valid.
    """
    global _default_client
    client = TwinkleClient(base_url, api_key, timeout=timeout, max_retries=max_retries, **kwargs)
    with _default_lock:
        _default_client = client
    return client


def get_default_client() -> TwinkleClient:
    """The client ``init_twinkle_client`` made, or one built from the environment."""
    global _default_client
    with _default_lock:
        if _default_client is None or _default_client._closed:
            if not (TWINKLE_SERVER_URL.get() or TWINKLE_SERVER_TOKEN.get()):
                raise TwinkleClientError(
                    "no Twinkle server: call init_twinkle_client(base_url=..., api_key=...) first "
                    "(or set TWINKLE_SERVER_URL and TWINKLE_SERVER_TOKEN)"
                )
            _default_client = TwinkleClient()
        return _default_client


__all__ = ["TwinkleClient", "get_default_client", "init_twinkle_client", "served_model_name"]


# How the server spells NaN and infinities in JSON (protobuf's JSON mapping).
_NON_FINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
# Keys whose values are names, never numbers: an adapter may be called "NaN".
_NAME_KEYS = ("name", "path", "id", "model", "message", "error", "detail", "status", "kind")


def non_finite_floats(value: Any) -> Any:
    """A reply's ``"NaN"`` / ``"Infinity"`` / ``"-Infinity"`` strings as floats again, in lists of
    numbers and as the values of keys that are not names (a diverged adapter's loss, log-probs,
    metrics)."""
    if isinstance(value, list):
        if any(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            return [_NON_FINITE.get(v, v) if isinstance(v, str) else v for v in value]
        return [non_finite_floats(v) for v in value]
    if isinstance(value, dict):
        return {
            k: (
                _NON_FINITE.get(v, v)
                if isinstance(v, str) and not str(k).endswith(_NAME_KEYS)
                else non_finite_floats(v)
            )
            for k, v in value.items()
        }
    return value
