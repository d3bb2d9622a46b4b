"""Image inputs in a pass: which tenants' images go through the vision tower, and the
multimodal rotary positions of their rows.

In a pass that mixes text-only and image tenants, only the image rows' ``pixel_values`` reach
the vision tower (concatenated in row order, as Qwen3.5 takes them); each image's patches are
routed to its tenant's adapter (``vision_routes``) for tenants that adapt the vision tower. Rows
keep the positions a pass of their own would give them: text rows their 1-D positions, image rows
Qwen's 3-D (time, height, width) positions from the model's own ``get_rope_index``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from twinkle.errors import InvalidArgumentError
from twinkle.model.lora import RowRoute
from twinkle.model.step.batch import IMAGE_KEYS, TenantBatch


def has_images(batch: TenantBatch) -> bool:
    """Whether the batch carries images."""
    grid = batch.tensors.get("image_grid_thw")
    return grid is not None and grid.numel() > 0


def vision_config(base_model: torch.nn.Module):
    """The model's vision config, or ``None`` for a text-only model."""
    return getattr(base_model.config, "vision_config", None)


def check_images_supported(base_model: torch.nn.Module, batch: TenantBatch) -> None:
    """Refuse image inputs on a model without a vision tower, and, on a model with one, rows
    whose ``<|image_pad|>`` tokens are not as many as their images' grids ask for.

    Without this check a row of image tokens and no ``pixel_values`` (for instance a sampled
    image prompt's ``SampleResult``, which carries tokens only) would be scored as if the
    image tokens were text: a silently wrong loss.

    Raises:
        InvalidArgumentError: The batch has images and the model reads none, or the image token
            count and the grids disagree.
    """
    vision = vision_config(base_model)
    if vision is None:
        if has_images(batch):
            raise InvalidArgumentError(
                f"adapter {batch.tenant!r}: inputs carry pixel_values / image_grid_thw but the "
                "base model has no vision tower (load a multimodal model such as "
                "tiny://qwen3.5-vl)"
            )
        return
    pads = int((batch.tensors["input_ids"] == base_model.config.image_token_id).sum())
    grid = batch.tensors["image_grid_thw"].long() if has_images(batch) else None
    need = 0 if grid is None else int(grid.prod(-1).sum()) // vision.spatial_merge_size**2
    if pads != need:
        hint = (
            " and no pixel_values: give the images with their tokens (pixel_values and "
            "image_grid_thw), or train on the trajectory; a SampleResult of an image prompt "
            "carries tokens only"
            if grid is None
            else f" but image_grid_thw {grid.tolist()} asks for {need}"
        )
        raise InvalidArgumentError(
            f"adapter {batch.tenant!r}: input_ids hold {pads} <|image_pad|> tokens{hint}"
        )


def vision_inputs(
    base_model: torch.nn.Module,
    batches: Sequence[TenantBatch],
    stacked: dict[str, torch.Tensor],
    device: torch.device,
) -> tuple[dict[str, torch.Tensor], list[RowRoute]]:
    """The extra model inputs of a pass over ``batches`` (stacked into ``stacked``) and the
    vision tower's routes; nothing when no batch has images.

    Returns:
        ``({'pixel_values', 'image_grid_thw', 'position_ids'}, vision_routes)``.
    """
    rows, grids, pixels, routes = [], [], [], []
    merge = (
        vision_config(base_model).spatial_merge_size ** 2 if any(map(has_images, batches)) else 0
    )
    row = token = 0
    for batch in batches:
        if has_images(batch):
            grid = batch.tensors["image_grid_thw"].long()
            tokens = int(grid.prod(-1).sum()) // merge
            routes.append(RowRoute(batch.tenant, token, token + tokens))
            rows.extend(range(row, row + batch.num_samples))
            grids.append(grid)
            pixels.append(batch.tensors["pixel_values"])
            token += tokens
        row += batch.num_samples
    if not routes:
        return {}, []
    grid = torch.cat(grids).to(device)
    extra = {
        "pixel_values": torch.cat(pixels).to(device),
        "image_grid_thw": grid,
        "position_ids": _position_ids(base_model, stacked, rows, grid),
    }
    return extra, routes


def _position_ids(
    base_model: torch.nn.Module,
    stacked: dict[str, torch.Tensor],
    image_rows: list[int],
    grid: torch.Tensor,
) -> torch.Tensor:
    """``[4, B, T]``: text positions, then (time, height, width) rotary positions. Text rows
    repeat their 1-D positions, as the model does for a text-only pass; image rows take the
    model's 3-D positions."""
    input_ids = stacked["input_ids"]
    rows, seq = input_ids.shape
    text = stacked.get("position_ids")
    if text is None:
        text = torch.arange(seq, device=input_ids.device).expand(rows, seq)
    positions = text[None].expand(4, rows, seq).clone()
    index = torch.tensor(image_rows, device=input_ids.device)
    ids = input_ids[index]
    mask = stacked.get("attention_mask")
    image_token = base_model.config.image_token_id
    rope, _ = base_model.model.get_rope_index(
        ids,
        mm_token_type_ids=(ids == image_token).int(),
        image_grid_thw=grid,
        attention_mask=None if mask is None else mask[index],
    )
    positions[1:, index] = rope.to(positions.dtype)
    return positions


__all__ = ["IMAGE_KEYS", "check_images_supported", "has_images", "vision_inputs"]
