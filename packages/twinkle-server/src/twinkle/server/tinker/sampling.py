"""Tinker sampling: sampling sessions and ``asample`` (a future answered with protobuf bytes)."""

from __future__ import annotations

from tinker import types

from twinkle.server.process.threads import off_loop
from twinkle.server.state.errors import NotFoundError
from twinkle.server.tinker import convert, sample_fields, stability, wire
from twinkle.server.tinker import images as tinker_images
from twinkle.server.tinker.admin import count_sample_usage
from twinkle.server.tinker.api import TinkerApi
from twinkle.server.tinker.futures import Proto
from twinkle.server.tinker.models import checkpoint_facts, model_facts
from twinkle.server.tinker.session_futures import sample_target
from twinkle.server.web.errors import BadRequest


def create_sampling_session(
    api: TinkerApi, owner: str, body: types.CreateSamplingSessionRequest
) -> dict:
    """The sampling session ``<session>:sample:<seq>`` of a base model or a checkpoint (a retry
    answers the session it created)."""
    base_model, path = body.base_model, None
    if body.model_path:
        facts = checkpoint_facts(api.state, owner, body.model_path)
        if base_model and base_model != facts.base_model:
            raise BadRequest(
                f"{body.model_path} was trained on {facts.base_model}, not {base_model}"
            )
        base_model, path = facts.base_model, facts.path
    if not base_model:
        raise BadRequest("create_sampling_session needs base_model or model_path")
    api.backends.sampler(base_model)
    sid = f"{body.session_id}:sample:{body.sampling_session_seq_id}"
    try:
        record = api.state.get_sampling_session(owner, sid)  # a retried request
    except NotFoundError:
        record = api.state.create_sampling_session(
            owner, body.session_id, base_model=base_model, model_path=path, sampling_session_id=sid
        )
    return {"sampling_session_id": record.sampling_session_id, "type": "create_sampling_session"}


def get_sampler(api: TinkerApi, owner: str, sampler_id: str) -> dict:
    """``GetSamplerResponse``: the base model and checkpoint a sampling session samples."""
    record = api.state.get_sampling_session(owner, sampler_id)
    path = convert.to_tinker_path(record.model_path) if record.model_path else None
    return {
        "sampler_id": record.sampling_session_id,
        "base_model": record.base_model,
        "model_path": path,
    }


async def asample(api: TinkerApi, owner: str, body: types.SampleRequest, idem: str | None) -> dict:
    """Queue one ``SampleRequest`` on the sampler deployment; the future's result is a
    protobuf ``SampleResponse``."""
    base_model, adapter = api.sampler_target(owner, body)
    client = api.backends.sampler(base_model)
    # Checked before the dedupe look-up too: a retry is answered with one id per sample.
    want_prompt_lp = bool(body.prompt_logprobs)
    params = convert.sampling_params(
        body.sampling_params,
        body.num_samples,
        want_prompt_lp,
        api.backends.sample_limits.get(base_model),
    )
    keys = api.dedupe_keys(idem, "asample", body.sampling_session_id, body.seq_id)
    if rid := api.futures.find(owner, keys):
        return api.submitted(rid, sample_sequence_ids=_sequence_ids(rid, body.num_samples))
    prompt = body.prompt.model_dump(mode="json")  # images as base64, as the JSON reader takes them
    tokens, images = await off_loop(tinker_images.prompt_inputs, prompt, base_model)
    convert.check_prompt(tokens, (await off_loop(model_facts, base_model)).vocab_size)
    extra, target_layout = sample_fields.sampler_params(body, len(tokens))
    params.update(extra)
    inputs = tokens if images is None else {"input_ids": tokens, **images}
    payload = {"inputs": [inputs], "adapter_uri": adapter, "sampling_params": params}

    async def run() -> Proto:
        result = (await client.call(owner, "sample", payload))["results"][0]
        count_sample_usage(
            api.state, owner, base_model, body.sampling_session_id, tokens, result["sequences"]
        )
        prompt_lp = result.get("prompt_logprobs") if want_prompt_lp else None
        if body.record_stability_info:
            ids = _sequence_ids(rid, body.num_samples)
            stability.record_samples(stability.store_for(api), owner, ids, result["sequences"])
        data = wire.encode_sample_response(result["sequences"], prompt_lp)
        return Proto(sample_fields.add_to_response(data, result, extra, target_layout))

    target = sample_target(body.sampling_session_id, body.seq_id)
    rid = api.futures.submit(owner, "sample", run, model_id=target, ordered=False, dedupe=keys)
    return api.submitted(rid, sample_sequence_ids=_sequence_ids(rid, body.num_samples))


def _sequence_ids(rid: str, num_samples: int) -> list[str]:
    return [f"{rid}:{i}" for i in range(num_samples)]


__all__ = ["asample", "create_sampling_session", "get_sampler"]
