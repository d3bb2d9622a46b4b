"""Everything one tenant owns on a shared model: adapter, optimizer, loss, template, progress."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from twinkle.model.lora.spec import AdapterSpec
from twinkle.model.metrics import AttachedMetrics, MetricAccumulator
from twinkle_client.tracking.history import TrainingHistoryRecorder
from twinkle_client.types import TrainConfigs  # one type: what the client gets, locally too


@dataclass
class Tenant:
    """Mutable per-tenant state. Nothing in here is shared with any other tenant.

    ``name`` is the key the model holds the adapter under; a server makes it an internal id
    that no tenant reads, and gives the tenant's own name as ``display_name``, which every
    message about the tenant shows (:attr:`label`).
    """

    name: str
    spec: AdapterSpec | None
    params: list
    gradient_accumulation_steps: int = 1
    flat: Any = None  # twinkle.model.flat.FlatAdapter: one buffer per kind behind ``params``
    loss: Any = None
    loss_config: dict[str, Any] | None = None
    optimizer: Any = None
    optimizer_config: dict[str, Any] | None = None
    scheduler: Any = None
    scheduler_config: dict[str, Any] | None = None
    template: Any = None
    template_name: str | None = None
    processor: Any = None
    processor_config: dict[str, Any] | None = None
    micro_step: int = 0
    cur_step: int = 0
    consumed_train_samples: int = 0
    last_grad_norm: float | None = None
    pending_grads: bool = False
    last_forward: Any = None
    train_metrics: MetricAccumulator = field(default_factory=MetricAccumulator)
    eval_metrics: MetricAccumulator = field(default_factory=MetricAccumulator)
    attached_metrics: AttachedMetrics = field(default_factory=AttachedMetrics)
    # One point per optimizer step (get_training_history), bounded like the server's record.
    history: TrainingHistoryRecorder = field(default_factory=TrainingHistoryRecorder)
    display_name: str | None = None

    @property
    def label(self) -> str:
        """The name messages about this tenant show: its own name, else the model's key."""
        return self.display_name or self.name

    def lr(self) -> float | None:
        if self.optimizer is None:
            return None
        return float(self.optimizer.param_groups[0]["lr"])

    def train_configs(self, model_id: str) -> TrainConfigs:
        lora = None
        if self.spec is not None:
            lora = {
                "r": self.spec.r,
                "lora_alpha": self.spec.lora_alpha,
                "lora_dropout": self.spec.lora_dropout,
                "use_rslora": self.spec.use_rslora,
                "target_modules": self.spec.target_modules,
            }
        return TrainConfigs(
            adapter_name=self.name,
            model_id=model_id,
            lora=lora,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            loss=self.loss_config,
            optimizer=self.optimizer_config,
            lr_scheduler=self.scheduler_config,
            template=self.template_name,
            processor=self.processor_config,
        )
