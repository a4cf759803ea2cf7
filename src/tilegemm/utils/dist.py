"""DeepGEMM's ``deep_gemm.utils.dist``: process-group setup and an all-gather of uneven sizes (NCCL, one GPU a rank)."""

from __future__ import annotations

import os

import torch

_local_rank: int | None = None


def init_dist(local_rank: int, num_local_ranks: int) -> tuple[int, int, object]:
    """Join the NCCL process group as local rank ``local_rank`` of ``num_local_ranks`` on this node.

    The node's place comes from the environment: ``MASTER_ADDR`` (127.0.0.1), ``MASTER_PORT`` (8361),
    ``WORLD_SIZE`` (nodes, 1) and ``RANK`` (this node, 0). Sets the current device to ``cuda:local_rank`` and makes
    CUDA the default device. Returns ``(global rank, world size, a group of every rank)``.
    """
    import torch.distributed as dist

    global _local_rank
    nodes, node = int(os.getenv("WORLD_SIZE", "1")), int(os.getenv("RANK", "0"))
    addr, port = os.getenv("MASTER_ADDR", "127.0.0.1"), int(os.getenv("MASTER_PORT", "8361"))
    _local_rank = local_rank
    torch.cuda.set_device(local_rank)
    dist.init_process_group(
        backend="nccl",
        init_method=f"tcp://{addr}:{port}",
        world_size=nodes * num_local_ranks,
        rank=node * num_local_ranks + local_rank,
        device_id=torch.device(f"cuda:{local_rank}"),
    )
    torch.set_default_device("cuda")
    return dist.get_rank(), dist.get_world_size(), dist.new_group(list(range(nodes * num_local_ranks)))


def uneven_all_gather(tensor: torch.Tensor, dim: int = 0, group: object = None) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along ``dim`` where the ranks' sizes along ``dim`` differ.

    Each rank pads to the largest size, all-gathers, and the padding is cut off again; the result has the sum of the
    sizes along ``dim`` and the ranks' rows in rank order.
    """
    import torch.distributed as dist

    world = dist.get_world_size(group)
    size = torch.tensor([tensor.shape[dim]], device=tensor.device, dtype=torch.long)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    lengths = [int(s.item()) for s in sizes]
    pad = max(lengths) - tensor.shape[dim]
    if pad:
        shape = list(tensor.shape)
        shape[dim] = pad
        tensor = torch.cat([tensor, tensor.new_zeros(shape)], dim=dim)
    tensor = tensor.contiguous()
    parts = [torch.empty_like(tensor) for _ in range(world)]
    dist.all_gather(parts, tensor, group=group)
    return torch.cat([p.narrow(dim, 0, n) for p, n in zip(parts, lengths)], dim=dim)


def dist_print(s: str = "", once_in_node: bool = False) -> None:
    """Print ``s`` on every rank (or only local rank 0 with ``once_in_node``), then wait for every rank."""
    import torch.distributed as dist

    if _local_rank is None:
        raise RuntimeError("dist_print: call init_dist first")
    if not once_in_node or _local_rank == 0:
        print(s, flush=True)
    dist.barrier()
