"""Seed 001's DDP demo on collcomm: the document's script with backend "nccl" -> "collcomm"
(and ``import collcomm.torch``), the ``.to(device)`` calls and ``device_ids`` dropped (CPU).

    torchrun --nproc_per_node=2 examples/seed001_ddp.py
    collcomm run -n 2 examples/seed001_ddp.py

Each rank draws its own data and its own initial weights (no common seed), so "Data mean"
and "Weight mean" differ between ranks; DDP broadcasts rank 0's parameters at
construction, so "DDP Weight mean" is the same on every rank (rank 0's "Weight mean"),
and the outputs differ again because the data do.
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import collcomm.torch  # noqa: F401 - registers backend "collcomm"


def main():
    # 初始化分布式环境，并使用 collcomm 作为通信后端。
    dist.init_process_group(backend="collcomm")
    rank = dist.get_rank()

    # 1. 验证数据是否相同
    data = torch.randn(20, 10)  # 每个进程独立生成随机数据
    print(f"Rank {rank}: Data mean={data.mean().item():.6f}, std={data.std().item():.6f}")

    # 2. 验证模型初始参数是否相同
    model = torch.nn.Linear(10, 10)  # 各进程独立初始化
    print(f"Rank {rank}: Weight mean={model.weight.mean().item():.6f}")

    # 3. DDP包装后参数同步验证
    ddp_model = DDP(model)  # DDP同步参数
    print(f"Rank {rank}: DDP Weight mean={ddp_model.module.weight.mean().item():.6f}")

    # 4. 计算输出
    result = ddp_model(data)
    print(f"Rank {rank}: Output mean={result.mean().item():.6f}")


if __name__ == "__main__":
    main()
