"""Check that ``twinkle_client`` mirrors ``twinkle``: same public names, same signatures.

For every module in :data:`MODULES`, every name in ``twinkle.<module>.__all__`` must exist in
``twinkle_client.<module>``; functions must have identical ``inspect.signature``s, and classes
identical constructor signatures and every public method (plus the container dunders a training
script uses) identical too. Intentional differences are listed in :data:`ALLOWED` with their
reason. Prints a report; exits 1 on any other difference.

Run: ``python tools/check_mirror.py``
"""

from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass
from typing import Any

MODULES = ("model", "sampler", "dataset", "dataloader", "processor", "data_format")
# Dunders a training script relies on (len(ds), ds[i], iteration, batches, calling a processor).
DUNDERS = ("__init__", "__len__", "__getitem__", "__getitems__", "__iter__", "__call__")

ALLOWED: dict[str, str] = {
    "model.MockModel": "a backend choice: the server's config picks mock/transformers/megatron",
    "model.MultiLoraMegatronModel": "a backend choice: the server's config picks "
    "mock/transformers/megatron",
    "model.MultiLoraTransformersModel.forward_backward_many": "fusing tenants is the server's job: "
    "it batches waiting forward_backward calls of different tenants by itself",
    "model.MultiLoraTransformersModel.clip_grad_and_step_many": "batching steps is the server's "
    "job too: it batches waiting clip_grad_and_step calls of different tenants by itself",
    "model.MultiLoraTransformersModel.adapter_state_dict": "weights stay on the server; save() a "
    "checkpoint and use its twinkle:// path instead",
    "model.MultiLoraTransformersModel.load_adapter_state_dict": "weights stay on the server; use "
    "load(twinkle_path)",
    "model.MultiLoraTransformersModel.routes": "direct calls into the torch model only exist locally",
    "model.MultiLoraTransformersModel.enable_paging": "a server sets adapter paging in its config "
    "(adapter_paging, max_paged_adapters), not a client",
    "model.TransformersModel.enable_paging": "inherited: same reason as for MultiLoraTransformersModel",
    "model.MultiLoraTransformersModel.adapter_peft_config": "the server writes the PEFT config into "
    "every checkpoint it saves; read it from the checkpoint",
    "model.MultiLoraTransformersModel.tenant": "a tenant's live state (tensors, optimizer) stays on "
    "the server; get_train_configs() reports its configuration",
    "model.MultiLoraTransformersModel.capabilities": "what the backend can fuse is the server's "
    "concern: it fuses waiting calls by itself",
    "model.MultiLoraTransformersModel.__init__": "adds options= (ExecutionOptions): a remote "
    "model's execution is the server's execution: block",
    "model.MultiLoraTransformersModel.direct_weight_grads": "an execution option: the server's "
    "execution: block sets it",
    "model.MultiLoraTransformersModel.recompute": "the decoder layers' recompute switch of the "
    "local torch model; the server's execution.activation_recompute sets it",
    "model.TransformersModel.recompute": "inherited: same reason as for MultiLoraTransformersModel",
    "model.TransformersModel.forward_backward_many": "inherited: same reason as for MultiLoraTransformersModel",
    "model.TransformersModel.clip_grad_and_step_many": "inherited: same reason as for MultiLoraTransformersModel",
    "model.TransformersModel.adapter_state_dict": "inherited: same reason as for MultiLoraTransformersModel",
    "model.TransformersModel.load_adapter_state_dict": "inherited: same reason as for MultiLoraTransformersModel",
    "model.TransformersModel.routes": "inherited: same reason as for MultiLoraTransformersModel",
    "model.TransformersModel.adapter_peft_config": "inherited: same reason as for "
    "MultiLoraTransformersModel",
    "model.TransformersModel.tenant": "inherited: same reason as for MultiLoraTransformersModel",
    "model.TransformersModel.__init__": "inherited: same reason as for MultiLoraTransformersModel",
    "model.TransformersModel.direct_weight_grads": "inherited: same reason as for "
    "MultiLoraTransformersModel",
    "model.TransformersModel.capabilities": "inherited: same reason as for MultiLoraTransformersModel",
    "sampler.Sampler.prepare_prompts": "prompts are rendered on the server with its template",
    "sampler.Sampler.stop_token_ids": "the server's template decides the stop tokens",
    "sampler.TorchSampler.prepare_prompts": "inherited: same reason as for Sampler",
    "sampler.TorchSampler.__init__": "adds options= (ExecutionOptions): a remote sampler's "
    "execution is the server's execution: block",
    "sampler.TorchSampler.stop_token_ids": "inherited: same reason as for Sampler",
    "sampler.Sampler.__init__": "adds max_length= (a local sampler's own length limit): a "
    "remote sampler's is the server config's",
    "sampler.MockSampler.__init__": "adds max_length= : same reason as for Sampler",
    "sampler.vLLMSampler.__init__": "adds max_length= : same reason as for Sampler",
    "sampler.MockSampler.prepare_prompts": "inherited: same reason as for Sampler",
    "sampler.MockSampler.stop_token_ids": "inherited: same reason as for Sampler",
    "sampler.vLLMSampler.prepare_prompts": "inherited: same reason as for Sampler",
    "sampler.vLLMSampler.stop_token_ids": "inherited: same reason as for Sampler",
    "sampler.Sampler.supports_extra_logprobs": "a backend capability the server checks; a remote "
    "sampler sends the fields and the server answers 400 where its backend lacks them",
    "sampler.TorchSampler.supports_extra_logprobs": "inherited: same reason as for Sampler",
    "sampler.MockSampler.supports_extra_logprobs": "inherited: same reason as for Sampler",
    "sampler.vLLMSampler.supports_extra_logprobs": "inherited: same reason as for Sampler",
    "sampler.Sampler.live_adapters": "a backend capability the server checks (inflight "
    "sampling); a remote sampler reaches live adapters through the server's own routes",
    "sampler.TorchSampler.live_adapters": "inherited: same reason as for Sampler",
    "sampler.MockSampler.live_adapters": "inherited: same reason as for Sampler",
    "sampler.vLLMSampler.live_adapters": "inherited: same reason as for Sampler",
    "dataset.Dataset.hf_dataset": "the rows live on the server; there is no local HF dataset",
    "dataset.LazyDataset.hf_dataset": "inherited from Dataset: the rows live on the server",
    "dataset.PackingDataset.hf_dataset": "inherited from Dataset: the rows live on the server",
}


@dataclass
class Finding:
    """One difference: ``key`` names it (``module.Name[.member]``), ``allowed`` its reason or None."""

    key: str
    problem: str
    allowed: str | None = None


def _public_members(cls: type) -> dict[str, Any]:
    """Members a user calls, defined by the class or its twinkle base classes."""
    members: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        if not base.__module__.startswith("twinkle"):
            continue
        for name, value in vars(base).items():
            if not name.startswith("_") or name in DUNDERS:
                members[name] = value
    return members


def _signature(obj: Any) -> inspect.Signature | None:
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if not callable(obj):
        return None
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):
        return None


def _compare_callables(key: str, local: Any, remote: Any, findings: list[Finding]) -> None:
    ours, theirs = _signature(local), _signature(remote)
    if ours is None or theirs is None:
        if (ours is None) != (theirs is None):
            findings.append(Finding(key, "one side is callable and the other is not"))
        return
    if ours != theirs:
        findings.append(
            Finding(
                key, f"signature differs:\n    twinkle:        {ours}\n    twinkle_client: {theirs}"
            )
        )


def _compare_class(key: str, local: type, remote: Any, findings: list[Finding]) -> None:
    if not isinstance(remote, type):
        findings.append(Finding(key, "is a class in twinkle but not in twinkle_client"))
        return
    _compare_callables(f"{key}.__init__", local, remote, findings)
    remote_members = _public_members(remote)
    for name, value in _public_members(local).items():
        if name == "__init__":
            continue
        member_key = f"{key}.{name}"
        if name not in remote_members and not hasattr(remote, name):
            findings.append(Finding(member_key, "missing in twinkle_client"))
        elif not isinstance(value, property):
            _compare_callables(
                member_key, value, remote_members.get(name, getattr(remote, name)), findings
            )


def compare(modules: tuple[str, ...] = MODULES) -> list[Finding]:
    """Every difference between ``twinkle.<m>`` and ``twinkle_client.<m>``, allowed or not."""
    findings: list[Finding] = []
    for module in modules:
        local_mod = importlib.import_module(f"twinkle.{module}")
        remote_mod = importlib.import_module(f"twinkle_client.{module}")
        for name in local_mod.__all__:
            key = f"{module}.{name}"
            local = getattr(local_mod, name)
            if not hasattr(remote_mod, name):
                findings.append(Finding(key, "missing in twinkle_client"))
                continue
            remote = getattr(remote_mod, name)
            if local is remote:
                continue
            if isinstance(local, type):
                _compare_class(key, local, remote, findings)
            else:
                _compare_callables(key, local, remote, findings)
    for finding in findings:
        finding.allowed = ALLOWED.get(finding.key)
    return findings


def main() -> int:
    findings = compare()
    errors = [f for f in findings if f.allowed is None]
    used = {f.key for f in findings}
    stale = sorted(set(ALLOWED) - used)
    print(f"twinkle_client mirror check over {', '.join(MODULES)}")
    for finding in findings:
        status = "allowed" if finding.allowed else "MISMATCH"
        print(f"  [{status}] {finding.key}: {finding.problem}")
        if finding.allowed:
            print(f"      reason: {finding.allowed}")
    for key in stale:
        print(f"  [STALE] {key}: listed in ALLOWED but no longer differs; remove it")
    print(
        f"{len(errors)} mismatch(es), {len(findings) - len(errors)} allowed difference(s), {len(stale)} stale"
    )
    return 1 if errors or stale else 0


if __name__ == "__main__":
    sys.exit(main())
