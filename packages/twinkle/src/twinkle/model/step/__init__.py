"""The training step as a layer: collate a tenant's inputs (:mod:`.batch`), run the shared base
model once over one or many tenants' rows (:mod:`.passes`), apply each tenant's loss and report
(:mod:`.loss`), backpropagate once (:mod:`.fused`).

Every function takes the objects it works on (the base model, its LoRA router, the device, the
tenants, a tenant's template and processor), never the model class that holds them: the
transformers and megatron backends are facades over this package.
"""

from twinkle.model.step.batch import Alignment, TenantBatch, collate, with_loss_inputs
from twinkle.model.step.fused import attach_grads, fused_forward_backward
from twinkle.model.step.loss import (
    compute_loss,
    loss_of,
    public_forward_output,
    public_output,
    record_metrics,
    record_train_metrics,
)
from twinkle.model.step.passes import ForwardState, forward_batches, run_base

__all__ = [
    "Alignment",
    "ForwardState",
    "TenantBatch",
    "attach_grads",
    "collate",
    "compute_loss",
    "forward_batches",
    "fused_forward_backward",
    "loss_of",
    "public_forward_output",
    "public_output",
    "record_metrics",
    "record_train_metrics",
    "run_base",
    "with_loss_inputs",
]
