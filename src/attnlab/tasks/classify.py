"""Text classification on the shared engine: encoding, the :class:`ClassifyTask`, and batched scoring.

**Encoding.** A text becomes the tokenizer's ids, cut to the model's position table (``max_positions``);
the number of texts cut is counted and reported, never silent. A text the tokenizer turns into nothing
(only characters it drops) becomes one ``<unk>``, so no row is all padding.

**Batches.** Examples of similar length are batched together (:func:`~attnlab.data.bucketed_batches`,
a deterministic function of seed and epoch, so resume is exact), padded to the longest in the batch. Under
DDP every process takes its share of the same global batch (:func:`~attnlab.training.distributed.shard`),
so all processes yield the same number of batches and the global batch is what one process would see.

**Loss** is the summed cross-entropy (with optional label smoothing); the engine divides by the global
example count. **Evaluation** returns accuracy as the ``score`` the engine selects on, and the mean loss.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.data import UNK_ID, bucketed_batches, pad_batch
from attnlab.errors import AttnlabError
from attnlab.training import Batch
from attnlab.training.distributed import Place, shard

TASK_NAME = "classify"


@dataclass
class Encoded:
    """Token ids of some texts and how many were cut to fit the position table.

    Attributes:
        ids: one id list per text, each at most ``max_len`` long and never empty.
        truncated: how many texts were longer than ``max_len``.
        max_len: the limit applied.
    """

    ids: list[list[int]]
    truncated: int
    max_len: int

    def note(self, what: str) -> str | None:
        """A one-line report of the truncation, or None when nothing was cut."""
        if not self.truncated:
            return None
        return (f"{what}: {self.truncated} of {len(self.ids)} texts were longer than the model's {self.max_len} "
                f"positions and were cut to fit")


def encode_texts(tokenizer, texts: Sequence[str], max_len: int) -> Encoded:
    """Tokenize ``texts`` and cut each to ``max_len`` ids (see the module docstring)."""
    batch = getattr(tokenizer, "encode_batch", None)
    raw = batch(list(texts)) if batch is not None else [tokenizer.encode(t) for t in texts]
    ids = [r[:max_len] or [UNK_ID] for r in raw]
    return Encoded(ids, sum(len(r) > max_len for r in raw), max_len)


@torch.no_grad()
def predict_logits(model: nn.Module, ids: Sequence[Sequence[int]], batch_size: int = 256,
                   device: torch.device | str = "cpu") -> Tensor:
    """Scores of every example, batched by length for speed: (n, num_classes) float32, in input order.

    Each row is the same as scoring its text alone (the padding mask makes batching invisible; the padding
    probe checks exactly this).
    """
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out: Tensor | None = None
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        logits = model(pad_batch([ids[i] for i in chunk]).to(device)).float().cpu()
        if out is None:
            out = torch.empty(len(ids), logits.shape[1])
        out[chunk] = logits
    assert out is not None, "no examples to score"
    return out


#: The label of a stand-in example whose loss is ignored (cross-entropy's default ``ignore_index``).
IGNORED_LABEL = -100


class ClassifyTask:
    """The engine's :class:`~attnlab.training.Task` for labelled texts.

    Args:
        train_ids, train_labels: encoded training texts and their class indices.
        valid_ids, valid_labels: the validation split (model selection only).
        unpredictable: validation rows left out of ``valid_ids`` because their label is none of the model's
            classes: each counts as an error in the accuracy (as in the run's report), not in the loss.
        batch_size: examples per global batch (all processes together).
        seed: fixes the batch order of every epoch.
        label_smoothing: cross-entropy label smoothing during training (evaluation uses none).
        each_head: the model has several heads (``TextClassifier(layer_heads=True)``): train each on its own
            cross-entropy (their mean), so that they are an ensemble rather than one co-adapted sum.
    """

    def __init__(self, train_ids: list[list[int]], train_labels: list[int], valid_ids: list[list[int]],
                 valid_labels: list[int], *, batch_size: int, seed: int, label_smoothing: float = 0.0,
                 each_head: bool = False, unpredictable: int = 0) -> None:
        self.train_ids, self.valid_ids, self.unpredictable = train_ids, valid_ids, unpredictable
        self.train_labels = torch.tensor(train_labels, dtype=torch.long)
        self.valid_labels = torch.tensor(valid_labels, dtype=torch.long)
        self.lengths = [len(x) for x in train_ids]
        self.batch_size, self.seed, self.label_smoothing = batch_size, seed, label_smoothing
        self.each_head = each_head

    def batches_per_epoch(self) -> int:
        return len(bucketed_batches(self.lengths, seed=self.seed, epoch=0, batch_size=self.batch_size))

    def batches(self, epoch: int, place: Place) -> Iterator[Batch]:
        """This process's share of each global batch of ``epoch``: {"ids": (b, longest), "labels": (b,)}."""
        for global_batch in bucketed_batches(self.lengths, seed=self.seed, epoch=epoch, batch_size=self.batch_size):
            index = shard(global_batch, place)
            if not index:
                # A last batch smaller than the world leaves this process no example. It runs one of the batch's
                # with its label ignored (a loss and gradient of exactly 0, through the same layers as the others
                # run), so that N processes train on what one process does; skipping the batch would not.
                stand_in = global_batch[:1]
                yield Batch({"ids": pad_batch([self.train_ids[i] for i in stand_in]),
                             "labels": torch.full((1,), IGNORED_LABEL, dtype=torch.long)}, count=0, tokens=0)
                continue
            yield Batch({"ids": pad_batch([self.train_ids[i] for i in index]), "labels": self.train_labels[index]},
                        count=len(index), tokens=sum(self.lengths[i] for i in index))

    def loss(self, model: nn.Module, data: dict[str, Tensor]) -> Tensor:
        """Summed cross-entropy of the batch (0-d); with several heads, the mean of their sums."""
        labels = data["labels"]
        if not self.each_head:
            return F.cross_entropy(model(data["ids"]).float(), labels, reduction="sum",
                                   label_smoothing=self.label_smoothing)
        per_head = model(data["ids"], each_head=True).float()  # (heads, batch, classes)
        flat = F.cross_entropy(per_head.flatten(0, 1), labels.repeat(per_head.shape[0]), reduction="sum",
                               label_smoothing=self.label_smoothing)
        return flat / per_head.shape[0]

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Validation accuracy (the ``score``; the unpredictable rows count as errors) and mean cross-entropy (of
        the rows the model can predict). The log said 14/297 where the run's report said 14/300."""
        device = next(model.parameters()).device
        logits = predict_logits(model, self.valid_ids, device=device)
        rows = len(self.valid_labels) + self.unpredictable
        correct = (logits.argmax(1) == self.valid_labels).sum().item()
        accuracy = correct / rows if rows else math.nan
        loss = F.cross_entropy(logits, self.valid_labels).item()
        return {"score": accuracy, "accuracy": accuracy, "loss": loss}


@dataclass
class Classifier:
    """A trained run, ready to score texts.

    Attributes:
        model: the kept (best) weights, in eval mode.
        tokenizer: the run's tokenizer.
        labels: class names, in output order.
        config: the run's config.json.
    """

    model: nn.Module
    tokenizer: object
    labels: list[str]
    config: dict

    @property
    def max_len(self) -> int:
        return int(self.config["max_positions"])

    def encode(self, texts: Sequence[str]) -> Encoded:
        """Token ids cut to the model's position table."""
        return encode_texts(self.tokenizer, texts, self.max_len)

    def logits(self, ids: Sequence[Sequence[int]]) -> Tensor:
        """(n, classes) scores of encoded texts."""
        return predict_logits(self.model, ids)


def load_classifier(run_dir: str | Path) -> Classifier:
    """The model, tokenizer and labels of a ``classify`` run folder; anything unusable is one clear error."""
    from attnlab.data import load_tokenizer
    from attnlab.tasks import classify_models  # noqa: F401  (registers TextClassifier for load_run)
    from attnlab.training.checkpoint import TOKENIZER, load_run

    run_dir = Path(run_dir)
    model, config = load_run(run_dir, TASK_NAME)
    labels = config.get("labels")
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        raise AttnlabError(f"{run_dir / 'config.json'} has no list of labels")
    classes = config.get("model", {}).get("kwargs", {}).get("num_classes")
    if len(set(labels)) != len(labels) or (classes is not None and len(labels) != classes):
        # a label per output, each once: another list would name the model's answers wrongly, or not at all
        raise AttnlabError(f"{run_dir / 'config.json'} lists {len(labels)} labels ({len(set(labels))} distinct) for "
                           f"a model of {classes} classes: the run folder mixes files of different runs")
    name, positions = config.get("tokenizer", TOKENIZER), config.get("max_positions")
    if not isinstance(name, str) or not name:
        raise AttnlabError(f"{run_dir / 'config.json'} names its tokenizer file {name!r}, not a file name")
    tokenizer = load_tokenizer(run_dir / name, model.encoder.embed.vocab_size)
    if isinstance(positions, bool) or not isinstance(positions, int) or positions < 1:  # (a slice of -3 cut texts)
        raise AttnlabError(f"{run_dir / 'config.json'} gives the model's max_positions as {positions!r}, not a "
                           "count of positions")
    return Classifier(model, tokenizer, labels, config)
