"""``ConfigError``: every problem of a config file, one ``<dotted.path>: <message>`` per line."""

from __future__ import annotations

from pydantic import ValidationError

_MESSAGES = {
    "extra_forbidden": "unknown field",
    "missing": "field required",
}


class ConfigError(ValueError):
    """The server config is missing, unreadable or invalid.

    Attributes:
        problems: one ``"<dotted.field.path>: <message>"`` string per problem.
        source: the file the config came from, when it came from a file.
    """

    def __init__(self, problems: list[str], source: str | None = None) -> None:
        self.problems = list(problems)
        self.source = source
        where = f" in {source}" if source else ""
        count = len(self.problems)
        header = f"{count} problem{'s' if count != 1 else ''} with the server config{where}:"
        super().__init__("\n".join([header, *(f"  {p}" for p in self.problems)]))

    @classmethod
    def from_validation_error(cls, error: ValidationError, source: str | None = None):
        """Turn pydantic's errors into ``<dotted.path>: <message>`` lines."""
        return cls([_describe(e) for e in error.errors(include_url=False)], source)


def dotted_path(loc: tuple[str | int, ...]) -> str:
    """``("applications", 1, "args", "port")`` -> ``applications[1].args.port``."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "<root>"


def _describe(error: dict) -> str:
    message = _MESSAGES.get(error["type"], error["msg"])
    message = message.removeprefix("Value error, ")
    return f"{dotted_path(tuple(error['loc']))}: {message}"
