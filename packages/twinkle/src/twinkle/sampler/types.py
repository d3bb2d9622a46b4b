"""What a sampling call takes (``SamplingParams``) and returns (``SampleResult`` per input).

Defined in ``twinkle_client.sampler.types`` (numpy only) and re-exported here, so local and
remote samplers return the very same classes.
"""

from twinkle_client.sampler.types import (
    IGNORE_INDEX,
    SampledSequence,
    SampleResponse,
    SampleResult,
    SamplingParams,
    StopReason,
    TokenLogprob,
    training_feature,
)

__all__ = [
    "IGNORE_INDEX",
    "SampleResponse",
    "SampleResult",
    "SampledSequence",
    "SamplingParams",
    "StopReason",
    "TokenLogprob",
    "training_feature",
]
