"""Self-cognition SFT with the official Tinker SDK: the seed's example ("Tinker 客户端 / 完整训练示例").

The seed's code, except that the server, key, base model and a step cap come from the environment
(defaults: the seed's values), so the same file runs against the seed's GPU config and the tiny
CPU one::

    TWINKLE_SERVER_URL    server address             (default http://localhost:8000)
    TWINKLE_SERVER_TOKEN  API key                    (default EMPTY_API_KEY)
    TWINKLE_BASE_MODEL    served base model          (default Qwen/Qwen3.5-4B)
    TWINKLE_MAX_STEPS     steps per epoch, 0 = all   (default 0: the seed's full loop)

    export TWINKLE_SERVER_API_KEYS=EMPTY_API_KEY
    twinkle-server launch -c cookbook/client/server/transformer/server_config.yaml
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

base_model = os.environ.get("TWINKLE_BASE_MODEL", "Qwen/Qwen3.5-4B")
base_url = os.environ.get("TWINKLE_SERVER_URL", "http://localhost:8000")
api_key = os.environ.get("TWINKLE_SERVER_TOKEN", "EMPTY_API_KEY")
max_steps = int(os.environ.get("TWINKLE_MAX_STEPS", "0"))  # per epoch; 0: the whole data set

# Step 2: 准备数据集
dataset = Dataset(dataset_meta=DatasetMeta("ms://swift/self-cognition", data_slice=range(500)))
dataset.set_template("Qwen3_5Template", model_id=f"ms://{base_model}", max_length=256)
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
for epoch in range(3):
    print(f"Epoch {epoch}")
    for step, batch in tqdm(enumerate(dataloader)):
        if max_steps and step >= max_steps:
            break
        # 将 Twinkle 的 InputFeature 转换为 Tinker 的 Datum 格式
        input_datum = [input_feature_to_datum(input_feature) for input_feature in batch]

        # 发送数据到 Server：前向 + 反向传播
        fwdbwd_future = training_client.forward_backward(input_datum, "cross_entropy")

        # 优化器更新：Adam 更新模型权重
        optim_future = training_client.optim_step(types.AdamParams(learning_rate=1e-4))

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
