"""Start Ray and Serve, deploy every application of a ``ServerConfig``, wait until ready, block.

Each ``import_path`` maps to a builder ``build_app(app_config, server_config) -> Application`` in
``APP_BUILDERS``, imported only when used so that validating a config needs neither Ray nor torch.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from twinkle.server.config import ApplicationConfig, ServerConfig
from twinkle.server.env import (
    RAY_ADDRESS,
    RAY_USAGE_STATS_ENABLED,
    TWINKLE_RAY_NAMESPACE,
    TWINKLE_TRUST_REMOTE_CODE,
)

logger = logging.getLogger("twinkle.server.process.launch")

APP_BUILDERS: dict[str, str] = {
    "server": "twinkle.server.gateway.deployment:build_app",
    "model": "twinkle.server.model.deployment:build_app",
    "sampler": "twinkle.server.sampler.deployment:build_app",
    "processor": "twinkle.server.processor.deployment:build_app",
}

DEFAULT_NUM_CPUS = 0.1  # a replica's default of 1 CPU leaves a 2-core machine unschedulable
DEFAULT_MAX_ONGOING_REQUESTS = {"server": 128, "model": 64, "sampler": 64, "processor": 32}
PROPAGATED_ENV = (TWINKLE_TRUST_REMOTE_CODE,)
READY_TIMEOUT_S = 900.0


class LaunchError(RuntimeError):
    """An application could not be built or did not become ready."""


def deployment_options(app_config: ApplicationConfig, deployment_name: str) -> dict[str, Any]:
    """Keyword arguments for ``serve.deployment(...).options(**opts)`` from the YAML.

    The deployment is matched by ``name``; an application with a single deployment entry uses it
    whatever its name. Defaults fill what the YAML omits: ``num_cpus=0.1``, ``num_gpus`` from the
    application's ``device_group`` (see :mod:`twinkle.server.process.placement`),
    ``max_ongoing_requests`` by application kind, and ``TWINKLE_TRUST_REMOTE_CODE`` copied from the
    launcher's environment unless the deployment sets it.

    Raises:
        LaunchError: the application lists several deployments and none is ``deployment_name``.
    """
    configured = app_config.deployment(deployment_name)
    if configured is None and len(app_config.deployments) == 1:
        configured = app_config.deployments[0]
    if configured is None and app_config.deployments:
        names = ", ".join(d.name for d in app_config.deployments)
        raise LaunchError(
            f"application '{app_config.name}' has no deployment '{deployment_name}' (has: {names})"
        )
    opts: dict[str, Any] = {
        "name": configured.name if configured else deployment_name,
        "max_ongoing_requests": DEFAULT_MAX_ONGOING_REQUESTS[app_config.import_path],
    }
    actor: dict[str, Any] = {"num_cpus": DEFAULT_NUM_CPUS}
    env_vars: dict[str, str] = {}
    runtime_env: dict[str, Any] = {}
    if configured is not None:
        if configured.max_ongoing_requests is not None:
            opts["max_ongoing_requests"] = configured.max_ongoing_requests
        if configured.num_replicas is not None:
            opts["num_replicas"] = configured.num_replicas
        if configured.autoscaling_config is not None:
            opts["autoscaling_config"] = configured.autoscaling_config.model_dump()
        options = configured.ray_actor_options
        actor.update(options.model_dump(exclude_none=True, exclude={"runtime_env", "resources"}))
        if options.resources:
            actor["resources"] = dict(options.resources)
        merged = configured.merged_runtime_env()
        env_vars.update(merged.env_vars)
        runtime_env.update(merged.model_dump(exclude_none=True, exclude={"env_vars"}))
    if "num_gpus" not in actor:
        from twinkle.server.process.placement import replica_num_gpus

        gpus = replica_num_gpus(app_config)
        if gpus:
            actor["num_gpus"] = gpus
    for variable in PROPAGATED_ENV:
        value = variable.raw()
        if value is not None:
            env_vars.setdefault(variable.name, value)
    if env_vars:
        runtime_env["env_vars"] = env_vars
    if runtime_env:
        actor["runtime_env"] = runtime_env
    opts["ray_actor_options"] = actor
    return opts


def resolve_builder(import_path: str) -> Callable[[ApplicationConfig, ServerConfig], Any]:
    """Import the builder registered for ``import_path`` in ``APP_BUILDERS``."""
    target = APP_BUILDERS[import_path]
    module_name, _, attribute = target.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise LaunchError(f"cannot load the '{import_path}' builder {target}: {error}") from error


# Ray settings for a Ray that ``launch`` starts itself (an environment value wins; a cluster
# started by ``ray start`` has the settings of that command's environment). Direct ingress: each
# ingress replica also serves HTTP on its own port (bound to ``http_options.host``), so clients
# that ask a model for its address (``GET .../endpoint``) skip Serve's proxy; it is on only for
# a loopback host unless ``http_options.direct_ingress`` says otherwise. Without a draining
# period, stopping the server does not wait 30 s for external load balancers.
# Memory: Ray's memory monitor, at 95% of the node's memory, kills "retriable" workers first,
# and those are the Serve controller, the gateway, the processor and the state store (actors
# Ray restarts), never a Serve replica: the control plane died for memory a model replica
# held. Each model replica keeps itself within its memory budget instead
# (``execution.memory_budget_mb``, twinkle.server.process.placement.memory_budget_mb), and should one
# still run the node out of memory, the kernel's OOM killer picks the largest of Ray's workers
# (Ray gives them all the same oom_score_adj, Ray's own daemons none): the replica that holds
# the memory, which Serve then starts again.
LOCAL_RAY_ENV = {
    "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0",
    "RAY_memory_monitor_refresh_ms": "0",
}


def use_local_ray_env(direct_ingress: bool = True) -> None:
    """Put ``LOCAL_RAY_ENV`` in this process's environment (values already there win); every
    Ray process started afterwards from here inherits it. ``direct_ingress=False`` (a public
    ``http_options.host`` without ``direct_ingress: true``) turns direct ingress off."""
    for name, value in LOCAL_RAY_ENV.items():
        if name == "RAY_SERVE_ENABLE_DIRECT_INGRESS" and not direct_ingress:
            value = "0"
        os.environ.setdefault(name, value)


OWN_RAY = "started a Ray of its own"


def init_ray(
    namespace: str | None = None, direct_ingress: bool = True, address: str | None = None
) -> str:
    """Start Ray or join a cluster, as ``address`` says; returns what happened, for the log.

    ``address``: ``local`` starts a Ray of this server's own even when a cluster runs on the
    machine; ``auto`` joins the cluster ``ray start`` runs on this machine (an error when none
    does); anything else is a cluster's address (``host:port``, ``ray://...``). ``None``:
    ``$RAY_ADDRESS``, else the seed's flow: join the cluster ``ray start`` runs on this machine
    when there is one, else start a Ray of its own. A Ray it starts gets ``LOCAL_RAY_ENV`` (with
    direct ingress as ``direct_ingress`` says, see :func:`use_local_ray_env`).
    """
    import ray

    os.environ.setdefault(RAY_USAGE_STATS_ENABLED.name, "0")
    if ray.is_initialized():
        return "using the Ray this process already runs"
    address = address or RAY_ADDRESS.get() or None
    if address is None:
        try:
            ray.init(address="auto", namespace=namespace, log_to_driver=False)
        except ConnectionError:
            address = "local"
        else:
            return (
                f"joined the Ray cluster started by `ray start` on this machine "
                f"({ray.get_runtime_context().gcs_address}); --address local starts a separate one"
            )
    if address == "local":
        use_local_ray_env(direct_ingress)
        ray.init(
            address="local",
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            log_to_driver=False,
            namespace=namespace,
        )
        return OWN_RAY
    ray.init(address=address, namespace=namespace, log_to_driver=False)
    return f"joined the Ray cluster at {address}"


def deploy(
    config: ServerConfig, ready_timeout_s: float = READY_TIMEOUT_S, *, replace: bool = False
) -> str:
    """Start Serve, deploy every application and wait until all are running.

    ``replace``: deploy over applications of the same names that already run in the cluster
    (another launch's); without it they are an error, never replaced silently.

    Returns:
        The gateway's base URL, e.g. ``http://127.0.0.1:8000/api/v1``, once it answers there.

    Raises:
        LaunchError: a builder failed, an application failed, the deadline passed, applications
            of the same names run already, or nothing answers at the configured address (Serve
            in a joined cluster already serves HTTP elsewhere).
    """
    from ray import serve

    http = config.http_options
    http_options: dict[str, Any] = {"host": http.host, "port": http.port}
    if http.request_timeout_s is not None:
        http_options["request_timeout_s"] = http.request_timeout_s
    serve.start(http_options=http_options, proxy_location=config.proxy_location)
    running = set(serve.status().applications)
    clash = sorted(running & {app.name for app in config.applications})
    if clash and not replace:
        raise LaunchError(
            f"application(s) {', '.join(clash)} already run in this Ray cluster (another "
            "server's); stop them (`serve shutdown`), launch with --address local for a Ray of "
            "this server's own, or pass --replace to deploy over them"
        )
    targets = []
    for app_config in config.applications:
        builder = resolve_builder(app_config.import_path)
        try:
            application = builder(app_config, config)
        except Exception as error:
            raise LaunchError(
                f"building application '{app_config.name}' failed: {error}"
            ) from error
        targets.append(
            serve.RunTarget(application, name=app_config.name, route_prefix=app_config.route_prefix)
        )
    # Deploy all at once without Serve's unbounded wait; our own wait has a deadline.
    serve.run_many(targets, wait_for_ingress_deployment_creation=False,
                   wait_for_applications_running=False)  # fmt: skip
    wait_until_running([app.name for app in config.applications], ready_timeout_s)
    host = "127.0.0.1" if http.host in ("0.0.0.0", "::") else http.host
    url = f"http://{host}:{http.port}{config.server_application.route_prefix}"
    if not _answers(f"{url}/healthz"):
        raise LaunchError(
            f"the applications run, but nothing answers at {url}: {_serving_elsewhere(http)}"
        )
    return url


def _answers(url: str, timeout_s: float = 15.0) -> bool:
    """Whether ``url`` answers 200 within ``timeout_s`` (Serve's proxy takes a moment)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)


def _serving_elsewhere(http: Any) -> str:
    """Why: Serve keeps the HTTP options it first started with in a cluster."""
    try:
        from ray.serve.context import _get_global_client

        actual = _get_global_client().get_serve_details().get("http_options") or {}
    except Exception:  # a private API: the reason is still worth saying without it
        actual = {}
    where = f" at {actual.get('host')}:{actual.get('port')}" if actual.get("port") else ""
    return (
        f"Serve in this Ray cluster was started before, with other HTTP options{where}, and "
        f"keeps them (asked: {http.host}:{http.port}); launch with --address local for a Ray of "
        "this server's own, or stop that Serve (`serve shutdown`)"
    )


def wait_until_running(names: list[str], timeout_s: float, poll_s: float = 0.5) -> None:
    """Poll ``serve.status()`` until every named application is RUNNING.

    Raises:
        LaunchError: an application failed (naming it and Serve's message), or ``timeout_s``
            passed (naming the applications not yet running).
    """
    from ray import serve

    deadline = time.monotonic() + timeout_s
    while True:
        statuses = serve.status().applications
        pending = []
        for name in names:
            status = statuses.get(name)
            state = str(getattr(status.status, "value", status.status)) if status else "NOT_STARTED"
            if state in ("DEPLOY_FAILED", "UNHEALTHY"):
                raise LaunchError(f"application '{name}' is {state}: {_describe(status)}")
            if state != "RUNNING":
                pending.append(f"'{name}' ({state}{': ' + _describe(status) if status else ''})")
        if not pending:
            return
        if time.monotonic() > deadline:
            raise LaunchError(
                f"not running after {timeout_s:.0f} s: {', '.join(pending)}. A replica that never "
                "schedules usually asks for more CPUs/GPUs than the cluster has "
                "(ray_actor_options.num_cpus / num_gpus)."
            )
        time.sleep(poll_s)


def _describe(status: Any) -> str:
    messages = [status.message] if status.message else []
    for name, deployment in status.deployments.items():
        if deployment.message:
            messages.append(f"{name}: {deployment.message}")
    return "; ".join(messages) or "no message"


def shutdown(applications: list[str] | None = None) -> None:
    """Stop Serve and disconnect from (or stop the local) Ray. ``applications``: in a cluster
    this server joined, delete only these (its own) and leave Serve and the others running."""
    import ray
    from ray import serve

    if ray.is_initialized():
        if applications is None:
            serve.shutdown()
        else:
            for name in applications:
                try:
                    serve.delete(name)
                except Exception as error:  # one that never deployed: the others still go
                    logger.warning("could not delete application %s: %s", name, error)
        ray.shutdown()


def launch(
    config: ServerConfig,
    namespace: str | None = None,
    blocking: bool = True,
    *,
    ready_timeout_s: float = READY_TIMEOUT_S,
    address: str | None = None,
    replace: bool = False,
) -> str:
    """Serve ``config``: start Ray and Serve, deploy, wait until ready, print the URL.

    Args:
        config: the validated server config.
        namespace: the Ray namespace (default: ``$TWINKLE_RAY_NAMESPACE``, else anonymous).
        blocking: block until Ctrl-C or SIGTERM, then shut down; otherwise return at once and
            leave the caller to call ``shutdown()``.
        ready_timeout_s: how long all applications may take to become RUNNING.
        address: which Ray (see :func:`init_ray`): ``local``, ``auto`` or a cluster's address.
        replace: deploy over same-named applications another server runs in the cluster.

    Returns:
        The gateway's base URL.
    """
    from twinkle.server.process.preflight import preflight_problems

    problems = preflight_problems(config)
    if problems:
        raise LaunchError("cannot launch:\n  - " + "\n  - ".join(problems))
    # Keys are read here, once; replicas on any node get only their digests.
    config = config.model_copy(update={"auth": config.auth.sealed()})
    how = init_ray(
        namespace or TWINKLE_RAY_NAMESPACE.get() or None,
        config.http_options.serves_direct_ingress(),
        address,
    )
    print(f"Ray: {how}", flush=True)
    # In a joined cluster, stop only what this server deployed: Serve and the other
    # applications belong to whoever started them.
    own = None if how == OWN_RAY else [app.name for app in config.applications]
    try:
        url = deploy(config, ready_timeout_s, replace=replace)
    except LaunchError as error:
        clashed = "already run in this Ray cluster" in str(error)
        shutdown(None if own is None else ([] if clashed else own))
        raise
    except BaseException:
        shutdown(own)
        raise
    print(f"Twinkle server ready at {url}", flush=True)
    if blocking:
        try:
            _wait_for_stop_signal()
        finally:
            print("Shutting down the Twinkle server", flush=True)
            shutdown(own)
    return url


def _wait_for_stop_signal() -> None:
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
