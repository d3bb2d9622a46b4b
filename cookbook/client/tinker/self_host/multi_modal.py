"""Image + text SFT with the official Tinker SDK: ``ImageChunk``s in ``ModelInput``.

Each sample of ``builtin://self-cognition-vl`` (a picture and a question, an answer) is rendered
locally with the model's template; the runs of ``<|image_pad|>`` become ``ImageChunk``s (the PNG
bytes, ``expected_tokens`` = the run's length, which the server checks), the text between them
``EncodedTextChunk``s. Targets and weights are as long as ``ModelInput.length`` (an image chunk
counts its ``expected_tokens``); image positions carry no loss.

    TWINKLE_SERVER_URL    server address             (default http://localhost:8000)
    TWINKLE_SERVER_TOKEN  API key                    (default EMPTY_API_KEY)
    TWINKLE_BASE_MODEL    served multimodal model    (default Qwen/Qwen3.5-4B)
    TWINKLE_TEMPLATE_MODEL  where the template's tokenizer/processor come from
                          (default ms://<TWINKLE_BASE_MODEL>)
    TWINKLE_MAX_STEPS     training steps             (default 20)

    twinkle-server launch -c cookbook/client/server/tiny/server_config_vl.yaml
    TWINKLE_BASE_MODEL=tiny/qwen3.5-vl TWINKLE_TEMPLATE_MODEL=tiny://qwen3.5-vl \\
        python cookbook/client/tinker/self_host/multi_modal.py
"""

import os

from twinkle import init_tinker_client
from twinkle.data_format import ImagePart
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.preprocessor import SelfCognitionProcessor
from twinkle.template import Qwen3_5Template

init_tinker_client()

from tinker import ServiceClient, types  # noqa: E402

base_model = os.environ.get("TWINKLE_BASE_MODEL", "Qwen/Qwen3.5-4B")
base_url = os.environ.get("TWINKLE_SERVER_URL", "http://localhost:8000")
api_key = os.environ.get("TWINKLE_SERVER_TOKEN", "EMPTY_API_KEY")
template_model = os.environ.get("TWINKLE_TEMPLATE_MODEL", f"ms://{base_model}")
max_steps = int(os.environ.get("TWINKLE_MAX_STEPS", "20"))

template = Qwen3_5Template(model_id=template_model, max_length=256)
image_pad = template.tokenizer.convert_tokens_to_ids("<|image_pad|>")


def images_of(trajectory) -> list[bytes]:
    """The trajectory's pictures, in reading order, as encoded files."""
    return [
        ImagePart.model_validate(part).image_bytes()
        for message in trajectory["messages"]
        if isinstance(message["content"], list)
        for part in message["content"]
        if part.get("type") == "image"
    ]


def model_input(ids: list[int], images: list[bytes]) -> types.ModelInput:
    """Token ids with runs of <|image_pad|> -> text chunks and one ImageChunk per run."""
    chunks, text, pictures, i = [], [], iter(images), 0
    while i < len(ids):
        if ids[i] != image_pad:
            text.append(int(ids[i]))
            i += 1
            continue
        run = i
        while i < len(ids) and ids[i] == image_pad:
            i += 1
        if text:
            chunks.append(types.EncodedTextChunk(tokens=text))
            text = []
        chunks.append(types.ImageChunk(data=next(pictures), format="png", expected_tokens=i - run))
    if text:
        chunks.append(types.EncodedTextChunk(tokens=text))
    return types.ModelInput(chunks=chunks)


def datum(trajectory) -> types.Datum:
    feature = template.encode(trajectory)
    ids, labels = list(feature["input_ids"]), list(feature["labels"])
    targets = [max(int(t), 0) for t in labels[1:]]
    weights = [float(t != -100) for t in labels[1:]]
    return types.Datum(
        model_input=model_input(ids[:-1], images_of(trajectory)),
        loss_fn_inputs={"target_tokens": targets, "weights": weights},
    )


dataset = Dataset(DatasetMeta("builtin://self-cognition-vl"))
dataset.map(SelfCognitionProcessor("Twinkle", "ModelScope"))
rows = [dataset[i] for i in range(len(dataset))]
data = [datum(row) for row in rows]

service_client = ServiceClient(base_url=base_url, api_key=api_key)
training_client = service_client.create_lora_training_client(base_model=base_model, rank=8)

batch_size = 4
for step in range(max_steps):
    start = (step * batch_size) % len(data)
    batch = data[start : start + batch_size]
    fwd = training_client.forward_backward(batch, "cross_entropy").result()
    training_client.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    tokens = sum(sum(d.loss_fn_inputs["weights"].data) for d in batch)
    print(f"step {step} loss {fwd.metrics['loss:sum'] / tokens:.4f}", flush=True)

sampling_client = training_client.save_weights_and_get_sampling_client()
question = {"messages": rows[0]["messages"][:1]}
prompt_ids = list(template.encode(question, add_generation_prompt=True)["input_ids"])
prompt = model_input(prompt_ids, images_of(question))
result = sampling_client.sample(
    prompt, num_samples=1, sampling_params=types.SamplingParams(max_tokens=16, temperature=0.0)
).result()
print("Answer:", template.decode(result.sequences[0].tokens, skip_special_tokens=True))
