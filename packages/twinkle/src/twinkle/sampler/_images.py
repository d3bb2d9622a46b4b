"""Image prompts in a decode batch: the vision tower's inputs and routes, and Qwen's 3-D rotary
positions for the prefill and each decode step.

A batch may mix text-only and image prompts (and adapters). Only the image rows' patches reach
the vision tower, concatenated in row order as Qwen3.5 takes them; each row's image tokens are
routed to that row's adapter, so an adapter that adapts the vision tower sees its own images.
Text rows get the same positions as in a text-only batch (the model's ``get_rope_index`` gives
them ``arange``), image rows Qwen's (time, height, width) positions; after the prompt every row
moves on by one position per token from its own ``rope delta``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from twinkle.errors import InvalidArgumentError
from twinkle.model.lora import RowRoute


@dataclass
class BatchImages:
    """The images of one decode batch, in row order."""

    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor
    vision_routes: list[RowRoute]
    image_token_id: int
    rope_deltas_B: torch.Tensor | None = None  # set by the prefill's positions

    def prefill_kwargs(self) -> dict[str, torch.Tensor]:
        return {"pixel_values": self.pixel_values, "image_grid_thw": self.image_grid_thw}

    def full_positions(
        self, model: torch.nn.Module, ids_B_T: torch.Tensor, mask_B_T: torch.Tensor
    ) -> torch.Tensor:
        """``[4, B, T]`` positions of the whole batch: 1-D text positions, then the 3-D ones."""
        text_B_T = (mask_B_T.cumsum(dim=1) - 1).clamp(min=0)
        rope_3_B_T, deltas_B_1 = model.model.get_rope_index(
            ids_B_T,
            mm_token_type_ids=(ids_B_T == self.image_token_id).int(),
            image_grid_thw=self.image_grid_thw,
            attention_mask=mask_B_T,
        )
        self.rope_deltas_B = deltas_B_1.reshape(-1).to(ids_B_T.device)
        return torch.cat([text_B_T[None], rope_3_B_T.to(text_B_T.dtype)], dim=0)

    def step_positions(self, text_B_1: torch.Tensor) -> torch.Tensor:
        """``[4, B, 1]`` positions of the newest token of each row (after the prefill)."""
        rope_B_1 = text_B_1 + self.rope_deltas_B[:, None].to(text_B_1.dtype)
        return torch.cat([text_B_1[None], rope_B_1[None].expand(3, -1, -1)], dim=0)


def batch_images(
    model: torch.nn.Module,
    pixels: list[np.ndarray | None],
    grids: list[np.ndarray | None],
    adapters: list[str | None],
    device: torch.device,
    tokens: list[list[int]],
) -> BatchImages | None:
    """The vision inputs of a batch whose row ``b`` has ``pixels[b]`` / ``grids[b]`` (``None``
    for a text row) and adapter ``adapters[b]``; ``None`` when no row has images.

    Rows without an adapter must come first (the sampler sorts them so): the router counts the
    pass's image tokens up to the last route's end.

    Raises:
        InvalidArgumentError: Images for a model without a vision tower, or a row whose
            ``<|image_pad|>`` tokens are not as many as its images' grids ask for (a row with
            image tokens and no image included).
    """
    rows = [b for b, grid in enumerate(grids) if grid is not None and len(grid)]
    vision = getattr(model.config, "vision_config", None)
    image_token = getattr(model.config, "image_token_id", None)
    for b, row in enumerate(tokens):
        # Image tokens without their image (e.g. a SampleResult's tokens sent back as a
        # prompt) would be read as text: refuse them. (Rows are sorted by adapter here, so
        # the message cannot name the input's index.)
        pads = sum(1 for t in row if t == image_token) if vision is not None else 0
        if pads and b not in rows:
            raise InvalidArgumentError(
                f"inputs: a prompt holds {pads} <|image_pad|> tokens but no image: give "
                "pixel_values and image_grid_thw with its tokens, or send the trajectory with "
                "its image parts"
            )
    if not rows:
        return None
    if vision is None:
        raise InvalidArgumentError(
            "inputs: a prompt has images but the base model has no vision tower "
            "(serve a multimodal model such as tiny://qwen3.5-vl)"
        )
    merge = int(vision.spatial_merge_size) ** 2
    image_token = int(image_token)
    routes, token = [], 0
    for b in rows:
        count = int(np.asarray(grids[b]).prod(-1).sum()) // merge
        pads = sum(1 for t in tokens[b] if t == image_token)
        if pads != count:
            raise InvalidArgumentError(
                f"image_grid_thw: {grids[b].tolist()} asks for {count} image tokens but the "
                f"prompt holds {pads} <|image_pad|> tokens"
            )
        tokens_b = count
        if adapters[b] is not None:
            if routes and routes[-1].adapter == adapters[b] and routes[-1].end == token:
                routes[-1] = RowRoute(adapters[b], routes[-1].start, token + tokens_b)
            else:
                routes.append(RowRoute(adapters[b], token, token + tokens_b))
        token += tokens_b
    dtype = next(model.parameters()).dtype
    return BatchImages(
        pixel_values=torch.from_numpy(np.concatenate([pixels[b] for b in rows])).to(
            device=device, dtype=dtype
        ),
        image_grid_thw=torch.from_numpy(np.concatenate([grids[b] for b in rows])).to(device),
        vision_routes=routes,
        image_token_id=image_token,
    )
