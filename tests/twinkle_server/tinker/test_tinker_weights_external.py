"""The 0.38 SDK's weights calls beyond the core loop, against a live server: copy_weights,
save_weights_external + signed (optionally age-encrypted) download URLs, inflight sampling
clients, sampler handles in another process (join_sampling_session). Every id is 404 for another
tenant."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
from safetensors.numpy import load as load_tensors
from sdk_version import needs_in_process_server, requires_sdk
from tinker import types

from twinkle.server.testing import KEYS
from twinkle_client.tinker_compat import tinker_api_key

pytestmark = pytest.mark.integration

BASE_MODEL = "tiny/qwen3.5"
SEQ = np.random.default_rng(7).integers(10, 4000, size=16).tolist()
PROMPT = types.ModelInput.from_ints(SEQ[:8])


def datum(tokens: list[int]) -> types.Datum:
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )


def step(client, lr: float = 5e-2) -> None:
    client.forward_backward([datum(SEQ)], "cross_entropy").result(timeout=60)
    client.optim_step(types.AdamParams(learning_rate=lr)).result(timeout=60)


def target_logprobs(client) -> list[float]:
    """The trained model's logprobs of PROMPT[1:], as compute_logprobs reports them."""
    out = client.forward([datum(SEQ[:8])], "cross_entropy").result(timeout=60)
    return out.loss_fn_outputs[0]["logprobs"].tolist()


def owner_of(live_server, key: str) -> str:
    return live_server[1].context.authenticate({"x-api-key": KEYS[key]})


def checkpoint_files(live_server, tinker_path: str) -> dict[str, bytes]:
    state = live_server[1].context.state
    record = state.resolve_checkpoint_path(owner_of(live_server, "alice"), tinker_path)
    root = Path(record.local_dir)
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def alice(service):
    client = service.create_lora_training_client(base_model=BASE_MODEL, rank=4).result(timeout=60)
    step(client)
    return client


@pytest.fixture(scope="module")
def rest(service):
    return service.create_rest_client()


@pytest.fixture(scope="module")
def rest_bob(service_bob):
    return service_bob.create_rest_client()


@needs_in_process_server
def test_copy_weights_links_the_same_bytes_into_a_new_run(
    live_server, service, alice, rest, rest_bob
):
    source = alice.save_state("copy-src").result(timeout=60).path
    copied = rest.copy_weights(source, "proj-archive").result(timeout=60)
    run_id, kind, name = copied.removeprefix("tinker://").split("/")
    assert (kind, name) == ("weights", "copy-src") and run_id != alice.model_id
    assert checkpoint_files(live_server, copied) == checkpoint_files(live_server, source)
    listed = rest.list_checkpoints(run_id).result(timeout=30).checkpoints
    assert [c.tinker_path for c in listed] == [copied]
    # The copy loads and holds the same weights.
    restored = service.create_training_client_from_state(copied).result(timeout=60)
    np.testing.assert_allclose(target_logprobs(restored), target_logprobs(alice), atol=1e-6)
    # A retry with the same idempotency key answers the first copy.
    with httpx.Client(base_url=live_server[0], headers={"X-API-Key": KEYS["alice"]}) as http:
        body = {"source_path": source, "destination_project_id": "p"}
        first, again = (
            http.post("/api/v1/copy_weights", json=body, headers={"X-Idempotency-Key": "c1"})
            for _ in range(2)
        )
        assert first.json() == again.json() and first.json()["tinker_path"] != copied
    with pytest.raises(tinker.NotFoundError):
        rest_bob.copy_weights(source, "proj-bob").result(timeout=30)


@needs_in_process_server
def test_external_weights_download_through_signed_urls(live_server, alice, rest, rest_bob):
    reference = alice.save_weights_for_sampler("ext-ref").result(timeout=60).path
    path = alice.save_weights_external("ext-plain").result(timeout=60).path
    assert path == f"tinker://{alice.model_id}/external_weights/ext-plain"
    reply = rest.get_external_weights_urls(path).result(timeout=30)
    assert set(reply.urls) == {"adapter_config.json", "adapter_model.safetensors"}
    with httpx.Client() as http:  # no API key: the signature is the credential
        files = {rel: http.get(url).raise_for_status().content for rel, url in reply.urls.items()}
    assert files == checkpoint_files(live_server, path)
    ref_files = checkpoint_files(live_server, reference)
    expected = load_tensors(ref_files["adapter_model.safetensors"])
    got = load_tensors(files["adapter_model.safetensors"])
    assert got.keys() == expected.keys()
    assert all(np.array_equal(got[k], expected[k]) for k in expected)
    assert json.loads(files["adapter_config.json"])["r"] == 4
    ckpts = rest.list_checkpoints(alice.model_id).result(timeout=30).checkpoints
    assert {"external_weights/ext-plain": "external"}.items() <= {
        c.checkpoint_id: c.checkpoint_type for c in ckpts
    }.items()
    with pytest.raises(tinker.NotFoundError):
        rest_bob.get_external_weights_urls(path).result(timeout=30)


@needs_in_process_server
def test_signed_urls_refuse_tampering_and_expiry(live_server, alice, rest):
    from twinkle.server.tinker.weights_external import UrlSigner

    path = alice.save_weights_external("ext-sig").result(timeout=60).path
    url = rest.get_external_weights_urls(path).result(timeout=30).urls["adapter_config.json"]
    signed, _, query = url.partition("?")
    params = dict(kv.split("=") for kv in query.split("&"))
    state = live_server[1].context.state
    owner = owner_of(live_server, "alice")
    stale = int(state.clock()) - 1
    stale_sig = UrlSigner(live_server[1].context.signer).sign(
        f"{owner}/{alice.model_id}/ext-sig/adapter_config.json", stale
    )
    with httpx.Client() as http:
        assert http.get(url).status_code == 200
        bad_sig = params["signature"][:-1] + ("0" if params["signature"][-1] != "0" else "1")
        assert (
            http.get(f"{signed}?expires={params['expires']}&signature={bad_sig}").status_code == 403
        )
        later = int(params["expires"]) + 3600
        assert (
            http.get(f"{signed}?expires={later}&signature={params['signature']}").status_code == 403
        )
        other = signed.replace("adapter_config.json", "adapter_model.safetensors")
        assert http.get(f"{other}?{query}").status_code == 403
        assert http.get(f"{signed}?expires={stale}&signature={stale_sig}").status_code == 403


@needs_in_process_server
def test_external_weights_encrypted_to_age_recipients(live_server, alice, rest):
    import pyrage

    identity = pyrage.x25519.Identity.generate()
    other = pyrage.x25519.Identity.generate()
    recipients = [str(identity.to_public()), str(other.to_public())]
    plain = checkpoint_files(
        live_server, alice.save_weights_external("ext-clear").result(timeout=60).path
    )
    path = (
        alice.save_weights_external("ext-age", age_encryption_recipients=recipients)
        .result(timeout=60)
        .path
    )
    urls = rest.get_external_weights_urls(path).result(timeout=30).urls
    assert set(urls) == {f"{name}.age" for name in plain}
    with httpx.Client() as http:
        for rel, url in urls.items():
            sealed = http.get(url).raise_for_status().content
            assert sealed != plain[rel.removesuffix(".age")]
            for ident in (identity, other):
                assert pyrage.decrypt(sealed, [ident]) == plain[rel.removesuffix(".age")]
            with pytest.raises(pyrage.DecryptError):
                pyrage.decrypt(sealed, [pyrage.x25519.Identity.generate()])
    with pytest.raises(tinker.BadRequestError, match="age"):
        alice.save_weights_external("ext-bad", age_encryption_recipients=["age1nope"]).result(
            timeout=30
        )


def _storage_files(live_server) -> set[str]:
    root = Path(live_server[1].context.storage_root)
    return {str(p) for p in root.rglob("*") if p.is_file()}


@needs_in_process_server
def test_inflight_sampling_uses_the_live_adapter_without_a_checkpoint(live_server, alice, rest):
    before_ckpts = len(rest.list_checkpoints(alice.model_id).result(timeout=30).checkpoints)
    before_files = _storage_files(live_server)
    sampler_a = alice.save_weights_and_get_sampling_client(kind="inflight").result(timeout=60)
    lp_w1 = target_logprobs(alice)
    got_a = sampler_a.compute_logprobs(PROMPT).result(timeout=60)
    assert got_a[0] is None
    np.testing.assert_allclose(got_a[1:], lp_w1, atol=1e-3)
    step(alice, lr=0.2)
    lp_w2 = target_logprobs(alice)
    assert max(abs(a - b) for a, b in zip(lp_w1, lp_w2)) > 1e-2
    sampler_b = alice.save_weights_and_get_sampling_client(kind="inflight").result(timeout=60)
    assert sampler_b._sampling_session_id != sampler_a._sampling_session_id
    # The shared target moved: old and new inflight clients sample the just-trained step.
    for sampler in (sampler_a, sampler_b):
        got = sampler.compute_logprobs(PROMPT).result(timeout=60)
        np.testing.assert_allclose(got[1:], lp_w2, atol=1e-3)
    sample = sampler_b.sample(PROMPT, 1, types.SamplingParams(max_tokens=3, seed=1)).result(60)
    assert 1 <= len(sample.sequences[0].tokens) <= 3
    assert len(rest.list_checkpoints(alice.model_id).result(timeout=30).checkpoints) == before_ckpts
    assert _storage_files(live_server) == before_files
    body = {
        "num_samples": 1,
        "sampling_session_id": sampler_b._sampling_session_id,
        "seq_id": 0,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": SEQ[:4]}]},
        "sampling_params": {"max_tokens": 2, "temperature": 1.0},
    }
    with httpx.Client(base_url=live_server[0], headers={"X-API-Key": KEYS["bob"]}) as http:
        assert http.post("/api/v1/asample", json=body).status_code == 404


_HANDLE_SCRIPT = """
import json, sys
from twinkle_client import init_tinker_client
init_tinker_client()
import tinker
from tinker import types
handle, tokens = sys.argv[1], json.loads(sys.argv[2])
first = tinker.SamplingClient.from_sampler_handle(handle)
second = tinker.SamplingClient.from_sampler_handle(handle)
prompt = types.ModelInput.from_ints(tokens)
out = [c.compute_logprobs(prompt).result(timeout=60) for c in (first, second)]
print(json.dumps({"logprobs": out, "ids": [first._cloned_sampler_id, second._cloned_sampler_id]}))
"""


@requires_sdk("0.38", "join_sampling_session")
def test_sampler_handle_in_another_process_joins_the_session(live_server, alice):
    sampler = alice.save_weights_and_get_sampling_client().result(timeout=60)
    expected = sampler.compute_logprobs(PROMPT).result(timeout=60)
    handle = sampler.get_sampler_handle()
    assert KEYS["alice"] not in handle
    env = {**os.environ, "TWINKLE_SERVER_TOKEN": KEYS["alice"]}
    env.pop("TINKER_API_KEY", None)
    done = subprocess.run(
        [sys.executable, "-c", _HANDLE_SCRIPT, handle, json.dumps(SEQ[:8])],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for got in result["logprobs"]:
        assert got[0] is None
        np.testing.assert_allclose(got[1:], expected[1:], atol=1e-6)
    assert sorted(result["ids"]) == [1, 2]  # allocated by join_sampling_session, original is 0
    # bob's key beside alice's handle token: two credentials naming different tenants
    foreign = tinker.SamplingClient.from_sampler_handle(handle, api_key=tinker_api_key(KEYS["bob"]))
    with pytest.raises(tinker.AuthenticationError, match="conflicting credentials"):
        foreign.compute_logprobs(PROMPT).result(timeout=60)


@requires_sdk("0.27", "get_checkpoint_archive_url (0.16.1's own client raises a TypeError)")
def test_checkpoint_archive_url_of_the_older_sdks(live_server, alice, rest, service_bob):
    """``get_checkpoint_archive_url`` (tinker 0.27/0.33; 0.38 dropped it): a signed ``.tar.gz``
    of the checkpoint; another tenant's URL request is 404 and a changed URL is refused."""
    import io
    import tarfile

    path = alice.save_state("archived").result(timeout=60).path
    run_id, _, checkpoint_id = path.removeprefix("tinker://").partition("/")
    if hasattr(rest, "get_checkpoint_archive_url"):
        url = rest.get_checkpoint_archive_url(run_id, checkpoint_id).result(timeout=60).url
    else:
        with httpx.Client(base_url=live_server[0], timeout=30) as http:
            reply = http.get(
                f"/api/v1/training_runs/{run_id}/checkpoints/{checkpoint_id}/archive",
                headers={"X-API-Key": tinker_api_key(KEYS["alice"])},
            )
        assert reply.status_code == 200, reply.text
        assert datetime.fromisoformat(reply.json()["expires"]) > datetime.now(timezone.utc)
        url = reply.json()["url"]
    with httpx.Client(base_url=live_server[0], timeout=30) as http:
        bob = http.get(
            f"/api/v1/training_runs/{run_id}/checkpoints/{checkpoint_id}/archive",
            headers={"X-API-Key": tinker_api_key(KEYS["bob"])},
        )
        archive = http.get(url)
        tampered = http.get(url.replace("archived.tar.gz", "other.tar.gz"))
    assert bob.status_code == 404
    assert archive.status_code == 200 and tampered.status_code == 403
    with tarfile.open(fileobj=io.BytesIO(archive.content), mode="r:gz") as tar:
        names = set(tar.getnames())
        config = json.loads(tar.extractfile("adapter_config.json").read())
    assert {"adapter_config.json", "adapter_model.safetensors"} <= names
    assert config["r"] == 4


def test_a_refused_signature_before_anything_was_signed_creates_no_secret():
    """A forged download URL or token reaching a server that never signed anything is refused
    and leaves the state as it was (the fuzzer saw the secret created by the refusal)."""
    from twinkle.server.state import MemoryStore, ServerState
    from twinkle.server.tinker.weights_external import UrlSigner
    from twinkle.server.web.signing import SECRET_KEY, Signer, TokenInvalid

    state = ServerState(MemoryStore("sign:"))
    signer = Signer(state)
    with pytest.raises(Exception, match="invalid download URL signature"):
        UrlSigner(signer).verify("o/r/n/f", "9999999999", "forged", now=0.0)
    assert signer.unsign("eyJ4IjoxfQ.forged") is None
    with pytest.raises(TokenInvalid):
        signer.verify_jwt("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJ4IjoxfQ.sig")
    assert state.store.get(SECRET_KEY) is None
    assert not signer.check("data", "\u00f4")  # a non-ASCII signature is a no, not a TypeError
    # Once something is signed, its signature checks and a wrong one does not.
    token = signer.sign("payload")
    assert signer.unsign(token) == "payload" and state.store.get(SECRET_KEY) is not None
    assert not signer.check("payload", "\u00f4")
