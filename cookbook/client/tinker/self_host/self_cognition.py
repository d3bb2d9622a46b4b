"""Self-cognition SFT with the official Tinker SDK: the seed's example, against the tiny server.

The seed's "Tinker 客户端 / 完整训练示例", verbatim except the base model (``tiny/qwen3.5`` instead of
``Qwen/Qwen3.5-4B``), the data set (the shipped ``builtin://self-cognition``) and a step cap
(``TINKER_MAX_STEPS``, default 8) so that it finishes in about a minute on a laptop CPU.

    TWINKLE_SERVER_API_KEYS=EMPTY_API_KEY \
        twinkle-server launch -c cookbook/client/server/tiny/server_config.yaml
    python cookbook/client/tinker/self_host/self_cognition.py
"""

import os

import numpy as np
from tinker import types
from tqdm import tqdm

from twinkle import init_tinker_client
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.preprocessor import SelfCognitionProcessor
from twinkle.server.common import input_feature_to_datum

# Step 1: 在导入 ServiceClient 之前，先初始化 Tinker 客户端
init_tinker_client()

from tinker import ServiceClient  # noqa: E402

base_model = "tiny/qwen3.5"  # the seed: 'Qwen/Qwen3.5-4B'
base_url = os.environ.get("TWINKLE_SERVER_URL", "http://localhost:8000")
api_key = os.environ.get("TWINKLE_SERVER_TOKEN", "EMPTY_API_KEY")
max_steps = int(os.environ.get("TINKER_MAX_STEPS", "8"))
epochs = int(os.environ.get("TINKER_EPOCHS", "1"))

# Step 2: 准备数据集
dataset = Dataset(dataset_meta=DatasetMeta("builtin://self-cognition", data_slice=range(64)))
dataset.set_template("Qwen3_5Template", model_id="tiny://qwen3.5", max_length=256)
dataset.map(SelfCognitionProcessor("twinkle模型", "twinkle团队"), load_from_cache_file=False)
dataset.encode(batched=True, load_from_cache_file=False)
dataloader = DataLoader(dataset=dataset, batch_size=8)

# Step 3: 初始化训练客户端
service_client = ServiceClient(base_url=base_url, api_key=api_key)

# 创建 LoRA 训练客户端（rank=16 指定 LoRA 适配器秩）
training_client = service_client.create_lora_training_client(
    base_model=base_model, rank=16
).result()

# Step 4: 训练循环
for epoch in range(epochs):
    print(f"Epoch {epoch}")
    for step, batch in tqdm(enumerate(dataloader)):
        if step >= max_steps:
            break
        # 将 Twinkle 的 InputFeature 转换为 Tinker 的 Datum 格式
        input_datum = [input_feature_to_datum(input_feature) for input_feature in batch]

        # 发送数据到 Server：前向 + 反向传播
        fwdbwd_future = training_client.forward_backward(input_datum, "cross_entropy")

        # 优化器更新：Adam 更新模型权重
        optim_future = training_client.optim_step(types.AdamParams(learning_rate=1e-3))

        # 等待两个操作完成
        fwdbwd_result = fwdbwd_future.result()
        optim_result = optim_future.result()

        # 计算每 token 加权平均 log-loss 用于监控
        logprobs = np.concatenate(
            [output["logprobs"].tolist() for output in fwdbwd_result.loss_fn_outputs]
        )
        weights = np.concatenate(
            [example.loss_fn_inputs["weights"].tolist() for example in input_datum]
        )
        print(f"Loss per token: {-np.dot(logprobs, weights) / weights.sum():.4f}")
        print(f"Training Metrics: {optim_result}")

    # 每个 epoch 保存检查点
    save_future = training_client.save_state(f"twinkle-lora-{epoch}")
    save_result = save_future.result()
    print(f"Saved checkpoint to {save_result.path}")

service_client.close("success").result()
