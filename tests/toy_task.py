"""A tiny classification task for the engine's tests: its data is made here, never read from disk."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.nn import EncoderClassifier
from attnlab.training import Batch
from attnlab.training.distributed import Place, shard


class ToyTask:
    """Label = whether token 3 occurs before token 4 in a random sequence (needs order and attention)."""

    def __init__(self, n: int = 96, batch_size: int = 8, seq: int = 10, seed: int = 0, fail_at_batch: int = -1):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(5, 20, (n, seq), generator=g)
        for row in self.ids:
            a, b = torch.randperm(seq, generator=g)[:2]
            row[a], row[b] = 3, 4
        pos3 = (self.ids == 3).float().argmax(1)
        pos4 = (self.ids == 4).float().argmax(1)
        self.labels = (pos3 < pos4).long()
        self.batch_size, self.seed, self.fail_at_batch = batch_size, seed, fail_at_batch
        self.calls = 0

    def model(self, dropout: float = 0.1) -> EncoderClassifier:
        return EncoderClassifier(20, 2, 16, 1, 2, 32, max_positions=10, dropout=dropout)

    def batches(self, epoch: int, place: Place):
        order = torch.randperm(len(self.ids), generator=torch.Generator().manual_seed(self.seed * 1000 + epoch))
        for start in range(0, len(order) - self.batch_size + 1, self.batch_size):
            index = shard(order[start : start + self.batch_size].tolist(), place)
            yield Batch({"ids": self.ids[index], "labels": self.labels[index]}, count=len(index),
                        tokens=len(index) * self.ids.shape[1])

    def loss(self, model, data):
        self.calls += 1
        if self.calls == self.fail_at_batch:
            raise KeyboardInterrupt  # stands in for the process being killed mid-run
        return F.cross_entropy(model(data["ids"]), data["labels"], reduction="sum")

    def evaluate(self, model):
        with torch.no_grad():
            logits = model(self.ids[:32])
        loss = F.cross_entropy(logits, self.labels[:32]).item()
        return {"loss": loss, "score": -loss, "accuracy": (logits.argmax(1) == self.labels[:32]).float().mean().item()}
