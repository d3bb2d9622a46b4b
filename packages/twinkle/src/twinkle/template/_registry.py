"""Name -> template class registry, so configs and remote calls can name a template."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twinkle.errors import ArgumentTypeError, InvalidArgumentError

if TYPE_CHECKING:
    from twinkle.template.base import Template

_TEMPLATES: dict[str, type[Template]] = {}


def register_template(cls: type[Template]) -> type[Template]:
    """Class decorator: make ``cls`` available to ``get_template`` under its class name."""
    _TEMPLATES[cls.__name__] = cls
    return cls


def list_templates() -> list[str]:
    """The registered template names, sorted."""
    return sorted(_TEMPLATES)


def get_template(template: str | type[Template] | Template, **kwargs: Any) -> Template:
    """Build a template from a registered name or a class, or pass an instance through.

    Args:
        template: ``'Qwen3_5Template'``, a ``Template`` subclass, or an instance.
        **kwargs: Constructor arguments (``model_id``, ``max_length``, ``truncation_strategy``...).

    Raises:
        ValueError: If the name is not registered (the message lists the known names).
        TypeError: If arguments are given together with an instance.
    """
    from twinkle.template.base import Template

    if isinstance(template, Template):
        if kwargs:
            raise ArgumentTypeError(
                f"cannot apply {sorted(kwargs)} to an already built {template!r}"
            )
        return template
    if isinstance(template, type) and issubclass(template, Template):
        return template(**kwargs)
    if isinstance(template, str):
        if template not in _TEMPLATES:
            raise InvalidArgumentError(
                f"unknown template {template!r}; known templates: {list_templates()}"
            )
        return _TEMPLATES[template](**kwargs)
    raise ArgumentTypeError(f"expected a template name, class or instance, got {type(template)!r}")
