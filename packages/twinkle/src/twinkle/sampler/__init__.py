"""Sampling: generate completions (and log-probs) from the base model with per-input LoRA adapters.

``TorchSampler`` runs anywhere transformers runs and batches different adapters into one
forward per decode step; ``vLLMSampler`` uses vLLM (an optional dependency). Both take
trajectories or token ids and return one :class:`SampleResult` per input, which is also a
training sample for ``model.forward_backward``. See ``docs/sampling.md``.
"""

from twinkle.sampler.base import Sampler
from twinkle.sampler.mock_sampler import MockSampler
from twinkle.sampler.torch_sampler import TorchSampler
from twinkle.sampler.types import (
    SampledSequence,
    SampleResponse,
    SampleResult,
    SamplingParams,
    TokenLogprob,
    training_feature,
)
from twinkle.sampler.vllm_sampler import vLLMSampler

__all__ = [
    "MockSampler",
    "SampleResponse",
    "SampleResult",
    "SampledSequence",
    "Sampler",
    "SamplingParams",
    "TokenLogprob",
    "TorchSampler",
    "training_feature",
    "vLLMSampler",
]
