"""Data-parallel training with ``torchrun``: process group set-up and the few collectives the engine uses.

``torchrun --nproc_per_node N -m attnlab.cli.main train ...`` starts N copies of the same command with
``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` set. :func:`setup` sees them, joins the process group (gloo on
the CPU, nccl on GPUs) and returns this process's place in it; a plain run is rank 0 of a world of 1
and never touches ``torch.distributed``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from attnlab.errors import AttnlabError


@dataclass(frozen=True)
class Place:
    """Where this process stands: its rank, the world size and its device."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """Rank 0 logs, evaluates and writes checkpoints; the others only train."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def is_main_process() -> bool:
    """Rank 0 under torchrun, or a plain run; known from the environment before the process group exists,
    so a task can decide who writes the run folder before the engine starts."""
    return int(os.environ.get("RANK", "0")) == 0


def check_batch_size(batch_size: int, option: str = "--batch-size") -> None:
    """Refuse a global batch smaller than the number of torchrun processes: some would never get an example."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if batch_size < world:
        raise AttnlabError(f"{option} {batch_size} is smaller than the {world} processes torchrun started: each "
                           "process takes a share of every global batch, so some would never train")


def choose_device(device: str = "auto") -> torch.device:
    """The device a run of ``device`` ("auto", "cpu" or "cuda") trains on: this process's GPU under torchrun."""
    use_cuda = torch.cuda.is_available() if device == "auto" else device.startswith("cuda")
    return torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if use_cuda else "cpu")


def setup(device: str = "auto") -> Place:
    """Join the process group when launched by torchrun; choose the device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    dev = choose_device(device)
    use_cuda = dev.type == "cuda"
    if use_cuda:
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", rank=rank, world_size=world)
    return Place(rank, world, dev)


def teardown(place: Place) -> None:
    """Leave the process group (a no-op for a single process)."""
    if place.distributed and dist.is_initialized():
        dist.destroy_process_group()


def all_sum(value: float, place: Place) -> float:
    """Sum a number over all processes."""
    if not place.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=place.device)
    dist.all_reduce(t)
    return float(t.item())


def broadcast_flag(flag: bool, place: Place) -> bool:
    """Rank 0's decision (stop, say), made known to every process."""
    if not place.distributed:
        return flag
    t = torch.tensor([int(flag)], device=place.device)
    dist.broadcast(t, src=0)
    return bool(t.item())


def checked_by_all(device: str = "auto") -> Place:
    """Join the process group and wait until every process has checked its inputs (the run folder above all).

    A task calls it between its checks and its first write, which rank 0 alone makes: a process that checked
    after rank 0 had written would find "a run" there, and one refusal is every process's refusal.
    """
    place = setup(device)
    barrier(place)
    return place


def all_gather(obj: object, place: Place) -> list:
    """Every process's ``obj`` (picklable), in rank order, on every process."""
    if not place.distributed:
        return [obj]
    gathered: list = [None] * place.world
    dist.all_gather_object(gathered, obj)
    return gathered


def barrier(place: Place) -> None:
    """Wait for every process (rank 0 writing a checkpoint, say)."""
    if place.distributed:
        dist.barrier()


def shard(items: list, place: Place) -> list:
    """This process's share of one global batch: every ``world``-th item from ``rank``."""
    return items[place.rank :: place.world]
