"""``OpenEnv``: an OpenEnv environment embedded in the script's process, as an ``Env``.

OpenEnv serves each environment from an HTTP/WebSocket server (usually in Docker), but the
server only wraps an ``openenv.core.env_server.interfaces.Environment`` object whose ``reset`` and
``step`` are plain Python. ``OpenEnv`` builds that object here and calls it directly: no server,
no container, no network.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any

from twinkle_agentic.envs.base import Env, StepResult

#: Environments that ship with twinkle_agentic, used when no package of that name is installed.
BUILTIN_ENVS = {"openspiel_env": "twinkle_agentic.envs.openspiel"}

_TEXT_FIELDS = ("text", "result", "output", "content", "message")
_STATUS_FIELDS = {"done", "reward", "metadata"}
_AGENTIC_EXTRA = "pip install 'twinkle[agentic]' (openenv-core and open-spiel)"

ActionMapper = Callable[[str, dict[str, Any]], Any]


class OpenEnv(Env):
    """An OpenEnv environment run in-process.

    Args:
        env_name: An OpenEnv environment package (``'openspiel_env'``, ``'echo_env'``...): its
            ``server`` subpackage's ``*Environment`` class and its top-level ``*Action`` class
            are used. ``'openspiel_env'`` falls back to the built-in
            ``twinkle_agentic.envs.openspiel`` when the package is not installed.
        env_cls: The environment class (or ``'module:Class'`` / ``'module.Class'``) instead of
            ``env_name``.
        env_kwargs: Keyword arguments of the environment's constructor (e.g.
            ``{'game_name': 'blackjack'}``).
        action_cls: The action class (or its import path); default: the discovered one. A dict
            action is turned into it.
        action_mapper: ``(tool_name, arguments) -> action`` (a dict or an action object); without
            it the tool call's arguments are the action's fields.
        tool_schema: OpenAI-style schemas to report from :meth:`tools`.

    Raises:
        ValueError: Neither ``env_name`` nor ``env_cls``.
        ModuleNotFoundError: ``env_name`` is not installed and not built in, or the agentic
            extra is missing.
    """

    def __init__(
        self,
        env_name: str | None = None,
        env_cls: type | str | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
        action_cls: type | str | None = None,
        action_mapper: ActionMapper | None = None,
        tool_schema: list[dict[str, Any]] | None = None,
    ) -> None:
        if env_name is None and env_cls is None:
            raise ValueError(
                "pass env_name (e.g. 'openspiel_env') or env_cls; example: "
                "OpenEnv(env_name='openspiel_env', env_kwargs={'game_name': 'blackjack'})"
            )
        discovered_action = None
        if env_cls is None:
            env_cls, discovered_action = _discover(env_name)
        elif isinstance(env_cls, str):
            env_cls = _import_object(env_cls)
        if isinstance(action_cls, str):
            action_cls = _import_object(action_cls)
        self.env_name = env_name or getattr(env_cls, "__name__", str(env_cls))
        self.env = env_cls(**dict(env_kwargs or {}))
        self.action_cls = action_cls or discovered_action
        self.action_mapper = action_mapper
        self._tool_schema = list(tool_schema or [])

    def reset(self) -> StepResult:
        """Start an episode; the result's ``observation`` is the text the model reads first."""
        return _step_result(self.env.reset())

    def step(self, tool_name: str, arguments: dict[str, Any] | None = None) -> StepResult:
        """Map the tool call to an action and apply it.

        Raises:
            Whatever the environment raises for an invalid action (a ``ToolManager`` turns it
            into an ``Error: ...`` answer for the model).
        """
        arguments = dict(arguments or {})
        action = self.action_mapper(tool_name, arguments) if self.action_mapper else arguments
        if isinstance(action, Mapping) and self.action_cls is not None:
            action = self.action_cls(**action)
        return _step_result(self.env.step(action))

    def tools(self) -> list[dict[str, Any]]:
        return list(self._tool_schema)

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if close is not None:
            close()


def _discover(env_name: str) -> tuple[type, type | None]:
    """The ``*Environment`` and ``*Action`` classes of an OpenEnv environment package."""
    try:
        package = importlib.import_module(env_name)
    except ModuleNotFoundError as exc:
        if exc.name != env_name.split(".")[0]:
            raise _missing_extra(exc) from exc
        if env_name not in BUILTIN_ENVS:
            raise ModuleNotFoundError(
                f"no OpenEnv environment {env_name!r}: install its package (OpenEnv's envs/"
                f"{env_name}) or pass env_cls=...; built in: {sorted(BUILTIN_ENVS)}",
                name=env_name,
            ) from exc
        package = _import_builtin(BUILTIN_ENVS[env_name])
        return _class_named(package, "Environment"), _class_named(package, "Action")
    environment = None
    server = importlib.import_module(f"{env_name}.server")
    for module_info in pkgutil.iter_modules(server.__path__):
        if module_info.name.endswith(("_environment", "_env")):
            module = importlib.import_module(f"{env_name}.server.{module_info.name}")
            environment = _class_named(module, "Environment")
            if environment is not None:
                break
    if environment is None:
        raise ModuleNotFoundError(
            f"{env_name}.server has no '*_environment' module with an '*Environment' class",
            name=env_name,
        )
    return environment, _class_named(package, "Action")


def _import_builtin(module_name: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise _missing_extra(exc) from exc


def _missing_extra(exc: ModuleNotFoundError) -> ModuleNotFoundError:
    return ModuleNotFoundError(
        f"OpenEnv needs the {exc.name!r} module: {_AGENTIC_EXTRA}", name=exc.name
    )


def _class_named(module: Any, suffix: str) -> type | None:
    """A class of ``module`` named ``<Something><suffix>`` (not the bare base names)."""
    names = getattr(module, "__all__", None) or dir(module)
    for name in names:
        value = getattr(module, name, None)
        if (
            isinstance(value, type)
            and name.endswith(suffix)
            and name not in (suffix, f"MCP{suffix}")
            and value.__module__.startswith(module.__name__)
        ):
            return value
    return None


def _import_object(path: str) -> Any:
    module_name, sep, attr = path.rpartition(":") if ":" in path else path.rpartition(".")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected 'module:Class' or 'module.Class', got {path!r}")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ImportError(f"module {module_name!r} has no {attr!r}") from None


def _step_result(observation: Any) -> StepResult:
    """An OpenEnv observation (or a client's step result that wraps one) as a ``StepResult``."""
    inner = getattr(observation, "observation", None)
    source = observation if inner is None else inner
    reward = _field(observation, "reward")
    done = _field(observation, "done")
    return StepResult(
        observation=observation_text(source),
        reward=float(reward or 0.0),
        done=bool(done),
        info={"raw": observation},
    )


def observation_text(observation: Any) -> str:
    """The text the model reads for an observation: itself when a string, its first text field
    (``text``, ``result``, ``output``, ``content``, ``message``), else its fields (less
    ``done`` / ``reward`` / ``metadata``) as JSON."""
    if observation is None:
        return ""
    if isinstance(observation, str):
        return observation
    for name in _TEXT_FIELDS:
        value = _field(observation, name)
        if isinstance(value, str) and value:
            return value
    if hasattr(observation, "model_dump"):
        fields = observation.model_dump(exclude=_STATUS_FIELDS)
    elif isinstance(observation, Mapping):
        fields = {k: v for k, v in observation.items() if k not in _STATUS_FIELDS}
    else:
        return str(observation)
    return json.dumps(fields, ensure_ascii=False, default=str)


def _field(value: Any, name: str) -> Any:
    if isinstance(value, Mapping):
        return value.get(name)
    return getattr(value, name, None)
