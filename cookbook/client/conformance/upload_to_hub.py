# Publishing an adapter through the Twinkle client, in ModelScope Twinkle's style: save, then
# upload_to_hub with the caller's hub token. The server uploads in the background; the call polls
# until the upload is done. The hub is the one at MODELSCOPE_ENDPOINT (a real one, or a stand-in).
import os

from peft import LoraConfig

from twinkle import get_logger, init_twinkle_client
from twinkle_client.model import MultiLoraTransformersModel

logger = get_logger()
base_model = os.environ.get("TWINKLE_MODEL_ID", "Qwen/Qwen3.5-4B")
hub_token = os.environ["MODELSCOPE_TOKEN"]
hub_model_id = os.environ.get("HUB_MODEL_ID", "alice/twinkle-conformance-lora")

init_twinkle_client(
    base_url=os.environ.get("TWINKLE_SERVER_URL", "http://localhost:8000"),
    api_key=os.environ.get("TWINKLE_SERVER_TOKEN", "EMPTY_TOKEN"),
)
model = MultiLoraTransformersModel(model_id=f"ms://{base_model}")
model.add_adapter_to_model("pub", LoraConfig(target_modules="all-linear", r=4, lora_alpha=8))
path = model.save(name="to-publish")
upload = model.upload_to_hub(
    checkpoint_dir=path.twinkle_path,
    hub_model_id=hub_model_id,
    hub_token=hub_token,
    poll_interval=0.5,
)
logger.info(f"upload: {dict(upload)}")
assert upload["status"] == "uploaded", upload
assert "adapter_model.safetensors" in upload["files"] and "adapter_config.json" in upload["files"]
logger.info(f"upload conformance passed: {hub_model_id}")
