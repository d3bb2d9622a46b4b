"""The ``twinkle-server`` command line (also ``python -m twinkle.server``).

Exit codes: 0 success, 1 invalid config or failed launch, 2 usage error.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from twinkle.server import __version__
from twinkle.server.env import TWINKLE_RAY_NAMESPACE, TWINKLE_SERVER_CONFIG

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2
CONFIG_ENV = TWINKLE_SERVER_CONFIG.name
NAMESPACE_ENV = TWINKLE_RAY_NAMESPACE.name


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of ``twinkle-server``."""
    parser = argparse.ArgumentParser(
        prog="twinkle-server",
        description="Serve a shared base model to many LoRA tenants (Twinkle and Tinker APIs).",
    )
    parser.add_argument("--version", action="version", version=f"twinkle-server {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    launch = commands.add_parser("launch", help="start the server (blocks until Ctrl-C/SIGTERM)")
    _add_config_option(launch)
    launch.add_argument(
        "--namespace", default=None, help=f"Ray namespace (default: ${NAMESPACE_ENV})"
    )
    launch.add_argument(
        "--local",
        action="store_true",
        help="serve every application in this one process with uvicorn, without Ray (development)",
    )
    launch.add_argument(
        "--address",
        default=None,
        help="which Ray: 'local' (start one of its own), 'auto' (join the cluster `ray start` "
        "runs on this machine) or a cluster address (default: $RAY_ADDRESS, else join a "
        "`ray start` cluster when one runs here, else start its own)",
    )
    launch.add_argument(
        "--replace",
        action="store_true",
        help="deploy over same-named applications another server runs in the joined cluster",
    )

    check = commands.add_parser("check-config", help="validate a config file without starting")
    _add_config_option(check)

    show = commands.add_parser("print-config", help="print the validated, normalised config")
    _add_config_option(show)
    show.add_argument("--format", choices=("yaml", "json"), default="yaml")

    clear = commands.add_parser("clear", help="delete stored server state")
    clear.add_argument("target", choices=("persistence",), help="what to clear")
    _add_config_option(clear)

    export = commands.add_parser(
        "export-history", help="write a run's stored training history to a tracker"
    )
    export.add_argument("run_id", metavar="RUN", help="the training run id")
    export.add_argument(
        "--to", required=True, choices=("tensorboard", "wandb", "mlflow", "swanlab")
    )
    export.add_argument("path", metavar="DIR", help="where the tracker writes (its directory)")
    _add_config_option(export)

    commands.add_parser(
        "status", help="show the state of a running server", add_help=False
    )  # its options belong to twinkle.server.process.status
    return parser


def _add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-c", "--config", default=None, help=f"server YAML file (default: ${CONFIG_ENV})"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override one field without editing the file, e.g. "
        "--set applications.sampler-Qwen3.5-4B.args.sampler_type=torch (repeatable)",
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if args.command != "status" and extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exit_:  # argparse exits on --help, --version and usage errors
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "status":
        return _status(extra)
    if not (args.config or TWINKLE_SERVER_CONFIG.is_set()):
        print(f"error: no config file: pass -c/--config or set {CONFIG_ENV}", file=sys.stderr)
        return EXIT_USAGE
    from twinkle.server.config import ConfigError, load_config

    try:
        config = load_config(args.config, overrides=args.overrides)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_INVALID
    return _COMMANDS[args.command](config, args)


def _check_config(config, args) -> int:
    from twinkle.server.process.preflight import preflight_problems

    problems = preflight_problems(config)
    if problems:
        print(f"error: the config is valid but cannot launch from here ({len(problems)} problem"
              f"{'s' if len(problems) > 1 else ''}):", file=sys.stderr)  # fmt: skip
        for problem in problems:
            print(f"  - {problem}", file=sys.stderr)
        return EXIT_INVALID
    names = ", ".join(app.name for app in config.applications)
    print(f"OK: {len(config.applications)} applications ({names})")
    return EXIT_OK


def _print_config(config, args) -> int:
    from twinkle.server.config import dump_config

    sys.stdout.write(dump_config(config, format=args.format))
    return EXIT_OK


def _launch(config, args) -> int:
    from twinkle.server.process.launch import LaunchError, launch
    from twinkle.server.process.preflight import preflight_problems

    problems = preflight_problems(config)
    if problems:  # before Ray starts: seconds, not a failed deployment minutes later
        print("error: cannot launch:", file=sys.stderr)
        for problem in problems:
            print(f"  - {problem}", file=sys.stderr)
        return EXIT_INVALID
    if args.local:
        from twinkle.server.process.local import serve_local

        try:
            serve_local(config)
        except LaunchError as error:
            print(f"error: {error}", file=sys.stderr)
            return EXIT_INVALID
        return EXIT_OK
    namespace = args.namespace or TWINKLE_RAY_NAMESPACE.get() or config.ray_namespace or None
    try:
        launch(
            config,
            namespace=namespace,
            blocking=True,
            address=args.address,
            replace=args.replace,
        )
    except LaunchError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_INVALID
    return EXIT_OK


def _clear(config, args) -> int:
    persistence = config.persistence
    if persistence.mode == "memory":
        print("persistence mode is 'memory': no state survives a restart, nothing to clear")
        return EXIT_OK
    from twinkle.server.state import clear_persistence

    removed = clear_persistence(persistence)
    where = persistence.file_path if persistence.mode == "file" else persistence.redis_url
    prefix = f" (key prefix '{persistence.key_prefix}')" if persistence.key_prefix else ""
    print(f"cleared {persistence.mode} persistence at {where}{prefix}: {removed} keys removed")
    return EXIT_OK


def _export_history(config, args) -> int:
    if config.persistence.mode == "memory":
        print("error: persistence mode is 'memory': the history lives in the running server; "
              "export it with TwinkleClient.export_history", file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    from twinkle.server.state._history import export_stored_history
    from twinkle.server.state.errors import NotFoundError

    try:
        count = export_stored_history(config.persistence, args.run_id, args.to, args.path)
    except NotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_INVALID
    print(f"exported {count} points of run {args.run_id} to {args.to} at {args.path}")
    return EXIT_OK


def _status(argv: list[str]) -> int:
    try:
        status = importlib.import_module("twinkle.server.process.status")
    except ModuleNotFoundError as error:
        if error.name != "twinkle.server.process.status":
            raise
        print("error: 'status' is not available in this install (no twinkle.server.process.status)",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    return status.main(argv)


_COMMANDS = {
    "launch": _launch,
    "check-config": _check_config,
    "print-config": _print_config,
    "clear": _clear,
    "export-history": _export_history,
}
