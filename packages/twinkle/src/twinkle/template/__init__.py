"""Chat templates: turn ``Trajectory`` objects into token ids and loss labels.

``get_template('Qwen3_5Template', model_id=...)`` builds one by name; ``Template`` itself renders
plain ChatML.
"""

from twinkle.template._registry import get_template, list_templates, register_template
from twinkle.template.base import IGNORE_INDEX, TRUNCATION_STRATEGIES, Template
from twinkle.template.qwen3 import Qwen3_5Template, Qwen3Template

register_template(Template)

__all__ = [
    "IGNORE_INDEX",
    "TRUNCATION_STRATEGIES",
    "Qwen3Template",
    "Qwen3_5Template",
    "Template",
    "get_template",
    "list_templates",
    "register_template",
]
