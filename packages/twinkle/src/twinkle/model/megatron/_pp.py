"""Pipeline parallel: one stage of the megatron GPTModel, activations sent between stages.

Every rank runs the same training code (``fused_forward_backward``, ``forward``/``backward``,
reference passes): the stage's model call is where the pipeline lives. The call splits the pass's
rows into microbatches; per microbatch the first stage embeds and runs its layers, each later
stage receives the previous stage's ``[seq, rows, hidden]`` activations, runs its layers and
sends them on; the last stage's output layer gives the logits, concatenated over microbatches.
So the loss is computed by the last stage on the WHOLE pass: each tenant's normaliser (tokens,
rows, ...) is the whole batch's and any twinkle loss is exact, whatever the microbatch count.

Backward: the last stage's loss backward reaches each microbatch's received activations, whose
gradient hook sends it to the previous stage; there a stand-in (:class:`_Tail`) receives it as
the gradient of that stage's output and autograd continues through its layers. An earlier stage
has no logits: it hands the training code zero logits, whose loss value is discarded (the
driver answers the last stage's results) and whose gradient is ignored. That keeps every rank
on one code path at the cost of a logits-sized zero tensor and its gradient on the earlier
stages.

Sends are ``torch.distributed.isend`` (completed before the next pass), receives blocking, each
tagged by microbatch so that stages may run their microbatches' backward in any order. Why not
megatron-core's ``p2p_communication`` / ``schedules``: in 0.16.1 they allocate their shape and
buffer tensors on ``torch.cuda.current_device()`` and call ``torch.cuda.synchronize()`` (no CPU
gloo path), and their schedules take a loss function per microbatch, so a tenant's loss could
not see its whole batch (sequence-level and grouped losses, exact per-tenant normalisation).
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from twinkle.model.megatron._model import MegatronCausalLM, _ShapeOnlyLinear, megatron_inputs
from twinkle.model.megatron._shims import cpu_shims

#: Tag offsets: forward activations (stage k -> k+1), their gradients (k+1 -> k), and the
#: status that precedes each gradient (1: a gradient follows, 0: the later stage failed the pass).
ACTIVATION_TAG, GRADIENT_TAG, STATUS_TAG = 0, 100_000, 200_000


class PipelineAbortedError(RuntimeError):
    """A later pipeline stage failed this pass (its error is the call's answer)."""


def check_pp(hf_config: Any, model_id: str, pp_size: int) -> None:
    """Refuse a pipeline size the layers do not split evenly by (megatron's even split).

    Raises:
        ValueError: Naming the layer count.
    """
    if pp_size < 1:
        raise ValueError(f"pp_size must be >= 1, got {pp_size}")
    from twinkle.model.megatron import _moe

    if pp_size > 1 and _moe.is_moe(hf_config):
        raise ValueError(
            f"backend 'megatron': pp_size {pp_size} with the MoE model {model_id} is not built "
            "(pipeline stages are built and tested for Qwen3 dense models); use pp_size 1"
        )
    layers = hf_config.num_hidden_layers
    if layers % pp_size:
        raise ValueError(
            f"backend 'megatron': pp_size {pp_size} does not divide {model_id}'s "
            f"num_hidden_layers ({layers}): every stage holds the same number of layers"
        )


def stage_layers(num_layers: int, pp_size: int, stage: int) -> range:
    """The HF layer indices pipeline stage ``stage`` holds (megatron's even split)."""
    per = num_layers // pp_size
    return range(stage * per, (stage + 1) * per)


def microbatch_rows(rows: int, microbatches: int) -> list[slice]:
    """``rows`` cut into at most ``microbatches`` contiguous, near-equal slices."""
    n = max(1, min(microbatches, rows))
    base, extra = divmod(rows, n)
    slices, at = [], 0
    for i in range(n):
        size = base + (i < extra)
        slices.append(slice(at, at + size))
        at += size
    return slices


def _shifted(routes, rows: slice) -> list:
    """The pass's row routes as seen by the microbatch ``rows`` (its first row is row 0)."""
    from twinkle.model.lora import RowRoute

    out = []
    for r in routes:
        start, end = max(r.start, rows.start), min(r.end, rows.stop)
        if start < end:
            out.append(RowRoute(r.adapter, start - rows.start, end - rows.start))
    return out


class _Tail(torch.autograd.Function):
    """An earlier stage's output: sent on in forward, its gradient received in backward (the
    zero logits it returns only keep the training code on its one path)."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, stage: PipelineCausalLM, tag: int, pass_: dict):
        ctx.stage, ctx.tag, ctx.shape, ctx.pass_ = stage, tag, out.shape, pass_
        stage.isend(out.detach().contiguous(), stage.next_rank, ACTIVATION_TAG + tag)
        seq, rows = out.shape[0], out.shape[1]
        return out.new_zeros(rows, seq, stage.config.vocab_size)

    @staticmethod
    def backward(ctx, _ignored: torch.Tensor):
        stage, pass_ = ctx.stage, ctx.pass_
        if not stage.status(ctx.tag, pass_):
            # The later stage refused the pass (a non-finite loss, an error in its loss): it sent
            # a 0 status for every microbatch it had not answered; fail here too (the training
            # code restores the gradients) once the rest of the pass's messages are taken.
            stage.drain(pass_)
            raise PipelineAbortedError("a later pipeline stage failed this pass")
        grad = torch.empty(ctx.shape, dtype=stage.act_dtype, device=stage.act_device)
        dist.recv(grad, stage.next_rank, tag=GRADIENT_TAG + ctx.tag)
        return grad, None, None, None


class PipelineCausalLM(MegatronCausalLM):
    """A pipeline stage of :class:`MegatronCausalLM`: same call, same logits on the last stage."""

    def __init__(self, gpt: torch.nn.Module, hf_config: Any, router: Any, *args, **kw) -> None:
        super().__init__(gpt, hf_config, router, *args, **kw)
        from megatron.core import parallel_state as ps

        object.__setattr__(self, "router", router)
        self.first = ps.is_pipeline_first_stage()
        self.last = ps.is_pipeline_last_stage()
        self.prev_rank = ps.get_pipeline_model_parallel_prev_rank()
        self.next_rank = ps.get_pipeline_model_parallel_next_rank()
        like = next(self.gpt.parameters())
        self.act_dtype, self.act_device = like.dtype, like.device
        self.microbatches = ps.get_pipeline_model_parallel_world_size()
        self._pending: list[tuple[Any, torch.Tensor]] = []
        #: Microbatches received with gradients on whose gradient the previous stage waits.
        self.outstanding: set[int] = set()
        #: The last pass sent on with gradients (its statuses and gradients still to come).
        self.current_pass: dict | None = None

    def get_input_embeddings(self) -> torch.nn.Module:
        # Only the first stage has the embedding: every stage shows the vocabulary's shape.
        like = next(self.gpt.parameters())
        return _ShapeOnlyLinear(self.config.hidden_size, self.config.vocab_size, like)

    def linear_head_weight(self) -> None:
        """None: a stage's call is the pipeline, which gives logits (materialised log-probs)."""
        return None

    def isend(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        self._pending.append((dist.isend(tensor, dst, tag=tag), tensor))

    def wait_sends(self) -> None:
        """Complete this stage's sends (the peer has received them when it got this far)."""
        pending, self._pending = self._pending, []
        for work, _ in pending:
            work.wait()

    def _send_gradient(self, grad: torch.Tensor, tag: int) -> None:
        self.isend(torch.ones(1, device=self.act_device), self.prev_rank, STATUS_TAG + tag)
        self.isend(grad.detach().contiguous(), self.prev_rank, GRADIENT_TAG + tag)
        self.outstanding.discard(tag)

    def status(self, tag: int, pass_: dict) -> bool:
        """The next stage's status for microbatch ``tag`` of a pass (True: a gradient follows)."""
        flag = torch.empty(1, device=self.act_device)
        dist.recv(flag, self.next_rank, tag=STATUS_TAG + tag)
        pass_["received"].add(tag)
        return bool(flag[0] > 0)

    def drain(self, pass_: dict | None = None) -> None:
        """Take every message the next stage still sends for a pass this stage gives up on (a
        status per microbatch, and the gradient after a 1), so none is left for the next pass."""
        pass_ = pass_ or self.current_pass
        self.current_pass = None
        if pass_ is None:
            return
        for tag in range(pass_["n"]):
            if tag not in pass_["received"] and self.status(tag, pass_):
                size = pass_["shapes"][tag]
                dist.recv(
                    torch.empty(size, dtype=self.act_dtype, device=self.act_device),
                    self.next_rank,
                    tag=GRADIENT_TAG + tag,
                )

    def abort_outstanding(self) -> None:
        """This stage failed the pass: tell the previous stage for every microbatch it waits on."""
        for tag in sorted(self.outstanding):
            self.isend(torch.zeros(1, device=self.act_device), self.prev_rank, STATUS_TAG + tag)
        self.outstanding.clear()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **_: Any,
    ) -> SimpleNamespace:
        self.wait_sends()
        position_ids, mask = megatron_inputs(input_ids, attention_mask, position_ids)
        seq = input_ids.shape[1]
        outs = []
        cuts = microbatch_rows(input_ids.shape[0], self.microbatches)
        pass_ = {"n": len(cuts), "received": set(), "shapes": {}}  # shared by its _Tail nodes
        if not self.last and torch.is_grad_enabled():
            self.current_pass = pass_
        with cpu_shims(self._device):
            for tag, rows in enumerate(cuts):
                if not self.first:
                    size = (seq, rows.stop - rows.start, self.config.hidden_size)
                    hidden = torch.empty(size, dtype=self.act_dtype, device=self.act_device)
                    dist.recv(hidden, self.prev_rank, tag=ACTIVATION_TAG + tag)
                    if torch.is_grad_enabled():
                        self.outstanding.add(tag)
                        hidden.requires_grad_(True)
                        hidden.register_hook(partial(self._send_gradient, tag=tag))
                    self.gpt.set_input_tensor(hidden)
                with self.router.route(_shifted(self.router.routes, rows)):
                    out = self.gpt(input_ids[rows], position_ids[rows], mask[rows])
                pass_["shapes"][tag] = out.shape
                outs.append(out if self.last else _Tail.apply(out, self, tag, pass_))
        return SimpleNamespace(logits=torch.cat(outs) if len(outs) > 1 else outs[0])


__all__ = ["PipelineCausalLM", "check_pp", "microbatch_rows", "stage_layers"]
