"""Remote models: the ``twinkle.model`` classes, trained on a Twinkle server.

``MultiLoraTransformersModel(model_id='ms://Qwen/Qwen3.5-4B')`` talks to the server's model
deployment (at the route the server publishes for ``Qwen/Qwen3.5-4B``) with the client
``init_twinkle_client`` made.
"""

from twinkle_client.model.adam import AdamParams
from twinkle_client.model.metrics import Metric
from twinkle_client.model.multi_lora import MultiLoraTransformersModel, TransformersModel

__all__ = ["AdamParams", "Metric", "MultiLoraTransformersModel", "TransformersModel"]
