"""Remote sampling: the ``twinkle.sampler`` API, run by the server's sampler deployment.

Results are the same types as ``twinkle.sampler`` (defined here, re-exported there): one
:class:`SampleResult` per input, which is also a training sample for ``model.forward_backward``.
"""

from twinkle_client.sampler.remote import MockSampler, Sampler, TorchSampler, vLLMSampler
from twinkle_client.sampler.types import (
    SampledSequence,
    SampleResponse,
    SampleResult,
    SamplingParams,
    TokenLogprob,
    training_feature,
)

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
