"""Model-side operations behind the Tinker weights endpoints beyond save/load.

- ``tinker_save_external``: the adapter in PEFT layout (``adapter_config.json`` +
  ``adapter_model.safetensors``, no optimizer state) as ``external_weights/<name>``; with
  ``age_encryption_recipients`` every file is encrypted to them (a real age implementation,
  ``pyrage``) and stored with a ``.age`` suffix, the plaintext never left on disk.
- ``tinker_adapter_state``: the live adapter (PEFT config + safetensors bytes, base64), read from
  the model in memory; what an ``inflight`` sampling client samples with (no checkpoint written).
"""

from __future__ import annotations

import base64
import shutil
from pathlib import Path
from typing import Any

from pydantic import Field

from twinkle.model.protocol import capabilities_of
from twinkle.server.model.protocol import Call, Empty, Operation, OperationTable, Request
from twinkle.server.state import validate_checkpoint_name
from twinkle.server.web.errors import BadRequest

EXTERNAL_KIND = "external_weights"
MAX_RECIPIENTS = 10


class SaveExternal(Request):
    name: str
    age_encryption_recipients: list[str] | None = Field(None, max_length=MAX_RECIPIENTS)


def age_recipients(recipients: list[str]) -> list[Any]:
    """Parse native ``age1...`` keys and SSH public keys; a malformed one is a 400."""
    try:
        import pyrage
    except ImportError as exc:  # the optional extra twinkle-server[age]
        raise BadRequest(
            "age_encryption_recipients needs pyrage on the server (pip install 'twinkle-server[age]')"
        ) from exc
    parsed = []
    for r in recipients:
        try:
            if r.startswith("age1"):
                parsed.append(pyrage.x25519.Recipient.from_str(r))
            else:
                parsed.append(pyrage.ssh.Recipient.from_str(r))
        except Exception as exc:  # noqa: BLE001 - pyrage.RecipientError and parse errors
            raise BadRequest(
                f"age_encryption_recipients: {r[:24]!r}... is not an age or SSH key: {exc}"
            ) from None
    return parsed


def encrypt_directory(directory: Path, recipients: list[Any]) -> None:
    """Replace every file under ``directory`` by ``<file>.age`` encrypted to ``recipients``."""
    import pyrage

    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        sealed = path.with_name(path.name + ".age")
        sealed.write_bytes(pyrage.encrypt(path.read_bytes(), recipients))
        path.unlink()


def tinker_save_external(service: Any, call: Call, request: SaveExternal) -> dict[str, Any]:
    entry = service.entry(call)
    name = validate_checkpoint_name(request.name)
    recipients = age_recipients(request.age_encryption_recipients or [])
    target = service.registry.checkpoint_dir(entry.owner, entry.run_id, EXTERNAL_KIND, name)
    staging = target.parent / f".{name}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        written = Path(
            service.model.save(
                name, output_dir=staging, save_optimizer=False, adapter_name=call.internal
            )
        )
        (written / "trainer_state.json").unlink(missing_ok=True)  # ours, not an HF file
        if recipients:
            encrypt_directory(written, recipients)
        shutil.rmtree(target, ignore_errors=True)
        written.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    path = service.registry.add_checkpoint(entry.owner, entry.run_id, EXTERNAL_KIND, name)
    size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
    return {"path": path, "size_bytes": size}


def tinker_adapter_state(service: Any, call: Call, request: Empty) -> dict[str, Any]:
    """The live adapter: its PEFT config and weights, copied from the model in memory."""
    from safetensors.torch import save as save_tensors

    model = service.model
    capabilities = capabilities_of(model)
    if not capabilities.adapter_state_io:
        raise BadRequest(
            "inflight sampling needs the transformers or megatron backend on this server"
        )
    # A tensor-parallel megatron model keeps its tenants in its rank processes (no ``tenant``
    # here); rank 0 holds every adapter whole, so its ``adapter_state_dict`` is the adapter.
    step = int(model.tenant(call.internal).cur_step) if capabilities.local_tenants else None
    state = {
        k: v.detach().to("cpu").contiguous()
        for k, v in model.adapter_state_dict(call.internal).items()
    }
    return {
        "config": model.adapter_peft_config(call.internal),
        "weights_b64": base64.b64encode(save_tensors(state)).decode("ascii"),
        "step": step,
    }


def weights_operations() -> OperationTable:
    return OperationTable(
        [
            Operation("tinker_save_external", SaveExternal, tinker_save_external),
            Operation("tinker_adapter_state", Empty, tinker_adapter_state),
        ]
    )


__all__ = ["EXTERNAL_KIND", "age_recipients", "encrypt_directory", "weights_operations"]
