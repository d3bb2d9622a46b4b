"""Merged-model export: the library merge, the download through a server, and hub publishing.

The merged directory must load with plain ``transformers`` and give the logits of base + adapter
(to 1e-5 on tiny://qwen3); the server builds it for the checkpoint's owner only and hands out
signed file URLs; the Hugging Face upload is driven by ``huggingface_hub``'s real client against
a loopback stand-in of the hub's HTTP API (below), the ModelScope one by modelscope's against
``modelscope_standin``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import torch

from twinkle.errors import InvalidArgumentError, PathNotFoundError  # noqa: E402
from twinkle.model.export import merge_adapter  # noqa: E402
from twinkle.server.testing import KEYS, local_server, serve_in_thread

MODEL_ID = "tiny://qwen3"
ROWS = [{"input_ids": list(range(10, 42)), "labels": list(range(10, 42))}]
INPUT_IDS = torch.tensor([list(range(5, 37))])


# ---------------------------------------------------------------- the library merge
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A MultiLoraTransformersModel with one trained adapter (B != 0), saved as ``ck``."""
    from peft import LoraConfig

    from twinkle.model import MultiLoraTransformersModel

    model = MultiLoraTransformersModel(MODEL_ID)
    model.add_adapter_to_model("a", LoraConfig(r=4, lora_alpha=16, target_modules="all-linear"))
    model.set_optimizer("AdamW", lr=5e-2, adapter_name="a")
    for _ in range(2):
        model.forward_backward(inputs=ROWS, adapter_name="a")
        model.clip_grad_and_step(adapter_name="a")
    path = model.save("ck", output_dir=tmp_path_factory.mktemp("ckpt"), adapter_name="a")
    return model, Path(path)


def _logits(directory: Path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    with torch.no_grad():
        return AutoModelForCausalLM.from_pretrained(directory).eval()(INPUT_IDS).logits


def test_merged_model_gives_the_logits_of_base_plus_adapter(trained, tmp_path):
    from transformers import AutoTokenizer

    from twinkle.model.lora import RowRoute

    model, checkpoint = trained
    merged = merge_adapter(MODEL_ID, checkpoint, tmp_path / "merged", max_shard_size="300KB")
    with torch.no_grad(), model.routes([RowRoute("a", 0, 1)]):
        adapted = model.model(input_ids=INPUT_IDS).logits
    with torch.no_grad():
        base = model.model(input_ids=INPUT_IDS).logits
    ours = _logits(merged.directory)
    torch.testing.assert_close(ours, adapted, atol=1e-5, rtol=0)
    assert (ours - base).abs().max() > 0.1  # the adapter matters: the check above means something
    # A standard, sharded Hugging Face directory, tokenizer and chat template included.
    index = json.loads((merged.directory / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and set(shards) <= set(merged.files)
    assert {"config.json", "generation_config.json", "tokenizer.json"} <= set(merged.files)
    assert "chat_template.jinja" in merged.files
    assert not any(name.startswith("adapter_") for name in merged.files)
    assert not any("lora" in key for key in index["weight_map"])
    assert AutoTokenizer.from_pretrained(merged.directory)("hello")["input_ids"]
    assert merged.size_bytes == sum((merged.directory / f).stat().st_size for f in merged.files)


def test_bad_input_is_refused_and_changes_nothing(trained, tmp_path):
    _, checkpoint = trained
    with pytest.raises(PathNotFoundError, match="adapter_model.safetensors"):
        merge_adapter(MODEL_ID, tmp_path, tmp_path / "out")
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("mine")
    with pytest.raises(InvalidArgumentError, match="out_dir"):
        merge_adapter(MODEL_ID, checkpoint, occupied)
    assert [p.name for p in occupied.iterdir()] == ["keep.txt"]
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- through the server
@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from twinkle_client import TwinkleClient
    from twinkle_client.model import MultiLoraTransformersModel

    server = local_server(tmp_path_factory.mktemp("export-server"))
    with serve_in_thread(server.app) as url:
        alice = TwinkleClient(base_url=url, api_key=KEYS["alice"], timeout=120)
        bob = TwinkleClient(base_url=url, api_key=KEYS["bob"], timeout=120)
        model = MultiLoraTransformersModel(MODEL_ID, client=alice)
        model.add_adapter_to_model("default", {"r": 4, "lora_alpha": 16})
        model.set_optimizer("AdamW", lr=5e-2)
        for _ in range(2):
            model.forward_backward(inputs=ROWS)
            model.clip_grad_and_step()
        path = str(model.save("ck-1"))
        yield url, server, alice, bob, path
        alice.close(), bob.close()


def test_download_through_the_server_loads_with_the_adapter_logits(live, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from twinkle.server.state.paths import tenant_id_for_key

    url, server, alice, _, path = live
    out = alice.export_merged(path, tmp_path / "merged", max_shard_size="300KB", timeout=60)
    record = server.context.state.resolve_checkpoint_path(tenant_id_for_key(KEYS["alice"]), path)
    base = AutoModelForCausalLM.from_pretrained(
        json.loads((Path(record.local_dir) / "adapter_config.json").read_text())[
            "base_model_name_or_path"
        ]
    )
    with torch.no_grad():
        expected = PeftModel.from_pretrained(base, record.local_dir).eval()(INPUT_IDS).logits
    torch.testing.assert_close(_logits(out), expected, atol=1e-5, rtol=0)
    assert (out / "model.safetensors.index.json").is_file()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no partial files left
    # Asked again: the same export, already built, nothing merged twice.
    import httpx

    headers = {"Authorization": f"Bearer {KEYS['alice']}"}
    again = httpx.post(
        f"{url}/api/v1/merged_exports",
        json={"twinkle_path": path, "max_shard_size": "300KB"},
        headers=headers,
    ).json()
    assert again["status"] == "ready" and sorted(again["files"]) == sorted(
        p.name for p in out.iterdir()
    )


def test_another_key_gets_404_and_a_forged_url_403(live, tmp_path):
    import httpx

    from twinkle_client.errors import BadRequestError, NotFoundError

    url, _, alice, bob, path = live
    with pytest.raises(NotFoundError):
        bob.export_merged(path, tmp_path / "bob")
    assert not (tmp_path / "bob").exists()
    status = alice.http.post("/api/v1/merged_exports", {"twinkle_path": path,
                                                       "max_shard_size": "300KB"})  # fmt: skip
    with pytest.raises(NotFoundError):
        bob.http.get(f"/api/v1/merged_exports/{status['export_id']}")
    ready = alice.http.get(f"/api/v1/merged_exports/{status['export_id']}")
    name, signed = next(iter(ready["files"].items()))
    assert httpx.get(signed).status_code == 200
    forged = re.sub(r"signature=[^&]+", "signature=AAAA", signed)
    assert httpx.get(forged).status_code == 403
    other = signed.replace(f"/{name}?", "/config.json?") if name != "config.json" else None
    if other:
        assert httpx.get(other).status_code == 403  # a signature covers one file only
    with pytest.raises(BadRequestError, match="max_shard_size"):
        alice.export_merged(path, tmp_path / "x", max_shard_size="huge")
    with pytest.raises(BadRequestError, match="unknown field"):
        alice.http.post("/api/v1/merged_exports", {"twinkle_path": path, "shard": 1})


# ---------------------------------------------------------------- Hugging Face Hub stand-in
class HfStandin:
    """Just the Hugging Face Hub endpoints ``HfApi.whoami``, ``create_repo`` and
    ``upload_folder`` (LFS transfer) call; every request is recorded with its bearer token."""

    def __init__(self, users: dict[str, str]) -> None:
        self.users, self.url = users, ""
        self.repos: dict[str, bool] = {}  # repo -> private
        self.files: dict[str, dict[str, bytes]] = {}
        self.blobs: dict[str, bytes] = {}
        self.tokens: list[str | None] = []
        self.lock = threading.Lock()

    def route(self, method: str, path: str, body: bytes, user: str) -> tuple[int, dict]:
        if method == "GET" and path == "/api/whoami-v2":
            return 200, {"type": "user", "name": user}
        if method == "POST" and path == "/api/repos/create":
            request = json.loads(body)
            repo = f"{request.get('organization') or user}/{request['name']}"
            if not repo.startswith(f"{user}/"):
                return 403, {"error": "no permission"}
            if repo in self.repos:
                return 409, {"error": "already exists", "url": f"{self.url}/{repo}"}
            # huggingface_hub 2 sends "visibility", older ones "private".
            self.repos[repo] = request.get("visibility", "private" if request.get("private")
                                           else "public") == "private"  # fmt: skip
            return 200, {"url": f"{self.url}/{repo}"}
        if match := re.fullmatch(r"/api/models/([^/]+/[^/]+)/preupload/[^/]+", path):
            files = json.loads(body)["files"]
            return 200, {"files": [
                {"path": f["path"], "shouldIgnore": False,
                 "uploadMode": "lfs" if f["path"].endswith(".safetensors") else "regular"}
                for f in files
            ]}  # fmt: skip
        if match := re.fullmatch(r"/([^/]+/[^/]+)\.git/info/lfs/objects/batch", path):
            objects = json.loads(body)["objects"]
            return 200, {"transfer": "basic", "objects": [
                {"oid": o["oid"], "size": o["size"],
                 "actions": {"upload": {"href": f"{self.url}/lfs/{o['oid']}"}}}
                for o in objects
            ]}  # fmt: skip
        if method == "PUT" and (match := re.fullmatch(r"/lfs/([0-9a-f]{64})", path)):
            self.blobs[match.group(1)] = body
            return 200, {}
        if match := re.fullmatch(r"/api/models/([^/]+/[^/]+)/commit/[^/]+", path):
            repo = match.group(1)
            if repo not in self.repos:
                return 404, {"error": f"{repo} not found"}
            files = self.files.setdefault(repo, {})
            for line in body.splitlines():
                item = json.loads(line)
                if item["key"] == "file":
                    files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                elif item["key"] == "lfsFile":
                    files[item["value"]["path"]] = self.blobs[item["value"]["oid"]]
            return 200, {"commitUrl": f"{self.url}/{repo}/commit/c0ffee", "commitOid": "c0ffee"}
        return 404, {"error": f"stand-in has no {method} {path}"}


@contextlib.contextmanager
def serve_hf_standin(users: dict[str, str]):
    hub = HfStandin(users)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _handle(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            auth = self.headers.get("Authorization") or ""
            token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
            with hub.lock:
                hub.tokens.append(token)
                user = hub.users.get(token or "")
                status, reply = (
                    (401, {"error": "Invalid credentials"})
                    if user is None and not self.path.startswith("/lfs/")
                    else hub.route(self.command, urlsplit(self.path).path, body, user or "")
                )
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = _handle

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hub.url = f"http://127.0.0.1:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown(), server.server_close()


@pytest.fixture
def hf_hub(monkeypatch):
    import huggingface_hub.constants

    # The LFS transfer: the Xet protocol needs a content-addressed store no stand-in offers.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)
    # The tests run offline (HF_HUB_OFFLINE=1); the stand-in is on the loopback.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with serve_hf_standin({"hf-alice": "alice"}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        yield hub


def test_publish_to_hugging_face_with_the_callers_token(live, hf_hub, tmp_path):
    from twinkle_client.errors import BadRequestError, NotFoundError

    _, _, alice, bob, path = live
    done = alice.publish_merged(path, "alice/tiny-merged", hub="hf", token="hf-alice",
                                max_shard_size="300KB", timeout=60, poll_interval=0.1)  # fmt: skip
    assert done["status"] == "uploaded" and done["url"] == f"{hf_hub.url}/alice/tiny-merged"
    assert hf_hub.repos == {"alice/tiny-merged": True}  # private by default
    local = alice.export_merged(path, tmp_path / "local", max_shard_size="300KB", timeout=60)
    uploaded = hf_hub.files["alice/tiny-merged"]
    assert uploaded == {p.name: p.read_bytes() for p in local.iterdir()}
    assert set(hf_hub.tokens) - {None} == {"hf-alice"}  # the caller's token, nothing else
    # A refused token is a 400 at once, and nothing is written.
    hf_hub.tokens.clear()
    with pytest.raises(BadRequestError, match="refused the token"):
        alice.publish_merged(path, "alice/other", hub="hf", token="hf-wrong")
    with pytest.raises(BadRequestError, match="token"):
        alice.publish_merged(path, "alice/other", hub="hf")
    assert "alice/other" not in hf_hub.repos
    # Another key's checkpoint: 404 before the hub hears anything.
    hf_hub.tokens.clear()
    with pytest.raises(NotFoundError):
        bob.publish_merged(path, "alice/stolen", hub="hf", token="hf-alice")
    assert hf_hub.tokens == []
    with pytest.raises(BadRequestError, match="repo_id"):
        alice.publish_merged(path, "no-slash", hub="hf", token="hf-alice")


def test_publish_to_modelscope(live, standin_hub):
    _, _, alice, _, path = live
    done = alice.publish_merged(path, "alice/tiny-merged", hub="ms", token="ms-alice",
                                max_shard_size="300KB", timeout=60, poll_interval=0.1)  # fmt: skip
    assert done["status"] == "uploaded"
    files = standin_hub.files["alice/tiny-merged"]
    assert {"config.json", "model.safetensors.index.json", "tokenizer.json"} <= set(files)
    assert json.loads(files["config.json"])["model_type"] == "qwen3"
