"""Self-cognition SFT through the Twinkle client: the seed's full example (docs: "Twinkle 客户端",
"完整训练示例").

The seed's code, except that the server, key, base model and a step cap come from the environment
(defaults: the seed's values), so the same file runs against the seed's GPU config and the tiny
CPU one::

    TWINKLE_SERVER_URL    server address             (default http://localhost:8000)
    TWINKLE_SERVER_TOKEN  API key                    (default EMPTY_API_KEY)
    TWINKLE_BASE_MODEL    served base model          (default Qwen/Qwen3.5-4B)
    TWINKLE_MAX_STEPS     steps per epoch, 0 = all   (default 0: the seed's full loop)

Start the server first (it accepts the key this script sends)::

    export TWINKLE_SERVER_API_KEYS=EMPTY_API_KEY
    twinkle-server launch -c cookbook/client/server/transformer/server_config.yaml
    python cookbook/client/twinkle/self_host/self_cognition.py

On a CPU machine (see docs/cookbook.md): the tiny config and ``TWINKLE_BASE_MODEL=tiny/qwen3.5``.
Run it again to see Step 2 list the runs and checkpoints of the first run.
"""

# ruff: noqa: E402, I001 - the documented example, imports as the docs show them
import os

import dotenv

dotenv.load_dotenv(".env")

from peft import LoraConfig
from twinkle import get_logger
from twinkle.dataset import DatasetMeta
from twinkle_client import init_twinkle_client

# DataLoader 和 Dataset 使用本地 twinkle 或远端 twinkle_client 均可
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset
from twinkle_client.model import MultiLoraTransformersModel

logger = get_logger()

base_model = os.environ.get("TWINKLE_BASE_MODEL", "Qwen/Qwen3.5-4B")
base_url = os.environ.get("TWINKLE_SERVER_URL", "http://localhost:8000")
api_key = os.environ.get("TWINKLE_SERVER_TOKEN", "EMPTY_API_KEY")
max_steps = int(os.environ.get("TWINKLE_MAX_STEPS", "0"))  # per epoch; 0: the whole data set

# Step 1: 初始化客户端
client = init_twinkle_client(base_url=base_url, api_key=api_key)

# 列出服务器支持的模型
print("Available models:")
for item in client.get_server_capabilities().supported_models:
    print("- " + item.model_name)

# Step 2: 查询已有训练运行（可选，用于恢复训练）
runs = client.list_training_runs()
resume_path = None
for run in runs:
    logger.info(run.model_dump_json(indent=2))
    checkpoints = client.list_checkpoints(run.training_run_id)
    for checkpoint in checkpoints:
        logger.info(checkpoint.model_dump_json(indent=2))
        # 取消注释以从检查点恢复：
        # resume_path = checkpoint.twinkle_path

# Step 3: 准备数据集
# data_slice 可限制加载的数据量
dataset = Dataset(dataset_meta=DatasetMeta("ms://swift/self-cognition", data_slice=range(500)))

# 设置 chat 模板，使数据匹配模型的输入格式
dataset.set_template("Qwen3_5Template", model_id=f"ms://{base_model}", max_length=512)

# 数据预处理：替换占位符为自定义名称
dataset.map(
    "SelfCognitionProcessor",
    init_args={"model_name": "twinkle模型", "model_author": "ModelScope社区"},
)

# 编码数据集为模型可用的 token
dataset.encode(batched=True)
# 数据量大时可用 num_proc 多进程加速：
# dataset.encode(batched=True, num_proc=8)
# 使用 twinkle_client.dataset 时，encode 是通过 HTTP 调用远端服务，
# 默认 600 秒超时，可用 timeout 参数按需调大：
# dataset.encode(batched=True, num_proc=8, timeout=3600)

# 创建 DataLoader
dataloader = DataLoader(dataset=dataset, batch_size=4)

# Step 4: 配置模型
model = MultiLoraTransformersModel(model_id=f"ms://{base_model}")

# 配置 LoRA：对所有线性层应用低秩适配器
lora_config = LoraConfig(target_modules="all-linear")
# gradient_accumulation_steps=2 表示累积 2 个 micro-batch 的梯度后再执行一次优化器更新
model.add_adapter_to_model("default", lora_config, gradient_accumulation_steps=2)

# 设置模板、处理器、损失函数
model.set_template("Qwen3_5Template")
model.set_processor("InputProcessor", padding_side="right")
model.set_loss("CrossEntropyLoss")

# 设置优化器（如果服务器使用 Megatron 后端，仅支持 Adam 优化器）
model.set_optimizer("Adam", lr=1e-4)

# 设置学习率调度器（如果服务器使用 Megatron 后端，不支持 LR 调度器）
# model.set_lr_scheduler('LinearLR')

# Step 5: 恢复训练（可选）
start_step = 0
if resume_path:
    logger.info(f"Resuming from checkpoint {resume_path}")
    progress = model.resume_from_checkpoint(resume_path)
    dataloader.resume_from_checkpoint(progress["consumed_train_samples"])
    start_step = progress["cur_step"]

# Step 6: 训练循环
logger.info(model.get_train_configs().model_dump())

for epoch in range(3):
    logger.info(f"Starting epoch {epoch}")
    for cur_step, batch in enumerate(dataloader, start=start_step + 1):
        if max_steps and cur_step > start_step + max_steps:
            break
        # 前向传播 + 反向传播
        model.forward_backward(inputs=batch)

        # 梯度裁剪 + 优化器更新（等价于依次调用 clip_grad_norm / step / zero_grad / lr_step）
        model.clip_grad_and_step()

        # 每 2 步打印一次指标（与 gradient_accumulation_steps 对齐）
        if cur_step % 2 == 0:
            metric = model.calculate_metric(is_training=True)
            logger.info(f"Current is step {cur_step} of {len(dataloader)}, metric: {metric.result}")

    # Step 7: 保存检查点
    twinkle_path = model.save(
        name=f"twinkle-epoch-{epoch}",
        save_optimizer=True,
        consumed_train_samples=dataloader.get_state()["consumed_train_samples"],
    )
    logger.info(f"Saved checkpoint: {twinkle_path}")

# Step 8: 上传到 ModelScope Hub（可选）
# YOUR_USER_NAME = "your_username"
# hub_model_id = f'{YOUR_USER_NAME}/twinkle-self-cognition'
# model.upload_to_hub(
#     checkpoint_dir=twinkle_path,
#     hub_model_id=hub_model_id,
#     async_upload=False
# )
