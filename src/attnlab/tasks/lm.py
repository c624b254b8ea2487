"""Language modelling on one text file: the data, the task the engine trains, and the cost figures.

**Data (nanoGPT's recipe).** The file is read whole; the *last* ``val_fraction`` of its characters is
the validation split, the rest the training split. A character vocabulary is built from the whole file
(as nanoGPT's ``prepare.py`` does, so the validation text never holds an unknown character); a BPE
vocabulary is trained on the training split only.

**Batches.** A training example is a random window of ``context + 1`` consecutive ids: the first
``context`` are the input, the last ``context`` the targets (position ``t`` predicts id ``t + 1``). An
"epoch" is a fixed number of batches whose window starts come from a generator seeded by
``(seed, epoch)``, so the engine's exact resume and DDP sharding (each process takes every
``world``-th window of the global batch) work as for any other task.

**Loss** is the cross-entropy in nats per target token, the unit nanoGPT reports. Validation is the mean
over ``eval_iters`` random validation batches, as nanoGPT's ``estimate_loss``; the windows are drawn
from a fixed generator, so every evaluation of a run scores the same windows and best-model selection
compares like with like. The final figure a run reports is scored on windows of another stream, so that
the windows the kept weights were chosen on do not flatter it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.data.tokenizers import BPETokenizer, CharTokenizer, load_tokenizer
from attnlab.errors import AttnlabError
from attnlab.files import decode_utf8
from attnlab.training import Batch
from attnlab.training.distributed import Place

TASK_NAME = "lm"


@dataclass
class LMData:
    """A text file as two id streams.

    Attributes:
        train, val: 1-D ``torch.long`` ids of the two splits.
        tokenizer: what turned the text into ids.
    """

    train: Tensor
    val: Tensor
    tokenizer: CharTokenizer | BPETokenizer


def read_text(path: str | Path, *, keep_bom: bool = False, once: bool = False) -> str:
    """The whole file as UTF-8 text; a missing, binary or empty file is an :class:`AttnlabError`.

    A leading byte-order mark is dropped (an editor's, no character of the text), unless ``keep_bom``: runs made
    before it was are resumed on the text they split. A pipe is read only by a caller that reads the text ``once``
    (``eval lm``); a training run reads it again for its fingerprint.
    """
    path = Path(path)
    if path.is_dir():
        raise AttnlabError(f"{path} is a folder, not a text file")
    if not path.exists():
        raise AttnlabError(f"no text file {path}")
    if not path.is_file() and not (once and path.is_fifo()):  # a pipe (<(...), /dev/stdin) or a device
        kind = "a pipe" if path.is_fifo() else "a device" if path.is_char_device() or path.is_block_device() else (
            "not a regular file")
        # (worded for `experiment leak` too, which has no --resume but fingerprints the text in its models' runs)
        twice = "" if once else (" the text is read twice (to train, and to record its fingerprint in the run "
                                 "folder);")
        raise AttnlabError(f"{path} is {kind}, not a text file:{twice} save it to a file first")
    text = decode_utf8(path.read_bytes(), path, bom=not keep_bom)
    if not text:
        raise AttnlabError(f"{path} is empty")
    return text


def load_lm_data(path: str | Path, *, tokenizer: str = "char", val_fraction: float = 0.1,
                 bpe_vocab_size: int = 2000, saved_tokenizer: str | Path | None = None,
                 keep_bom: bool = False) -> LMData:
    """Read, split (last ``val_fraction`` of the characters is validation) and tokenize a text file.

    ``saved_tokenizer``: the tokenizer file of the run being resumed, used instead of training one: a
    tokenizer trained again by another version of the code could give the same pieces other ids. ``keep_bom``:
    see :func:`read_text`.
    """
    if not 0.0 < val_fraction < 1.0:
        raise AttnlabError(f"--val-fraction must be between 0 and 1 (exclusive), got {val_fraction}")
    text = read_text(path, keep_bom=keep_bom)
    cut = int(len(text) * (1.0 - val_fraction))
    train_text, val_text = text[:cut], text[cut:]
    tok: CharTokenizer | BPETokenizer
    if saved_tokenizer is not None:
        loaded = load_tokenizer(saved_tokenizer)
        if loaded.kind != tokenizer:
            raise AttnlabError(f"{saved_tokenizer} is a {loaded.kind} tokenizer, but the run's settings say {tokenizer}")
        tok = loaded  # type: ignore[assignment]
    elif tokenizer == "char":
        tok = CharTokenizer.train(text)
    elif tokenizer == "bpe":
        # (line breaks and indentation are the text's own: a language model learns to write them)
        tok = BPETokenizer.train(_space_cut_chunks(train_text), vocab_size=bpe_vocab_size, collapse_whitespace=False)
    else:
        raise AttnlabError(f"unknown tokenizer {tokenizer!r}; use char or bpe")
    train = torch.tensor(tok.encode(train_text), dtype=torch.long)
    val = torch.tensor(tok.encode(val_text), dtype=torch.long)
    return LMData(train, val, tok)


def _space_cut_chunks(text: str, size: int = 1 << 16) -> Iterator[str]:
    """``text`` in pieces of about ``size`` characters, each cut just before a space.

    The tokenizer is trained on the words that encoding the whole text will meet: a piece that starts with a
    space gets the same word-start mark as that word inside the whole. (Training on lines would learn "unto" with
    the mark, while in the whole text the word after a line break has none, and its merges would never apply.)
    Where no space comes within another ``size`` characters (a script written without spaces), the piece is cut
    at ``size``: the trainer's time grows faster than a word's length."""
    start = 0
    while start < len(text):
        end = text.find(" ", start + size, start + 2 * size)
        end = min(start + size, len(text)) if end == -1 else end
        yield text[start:end]
        start = end


def seeded_generator(*parts: object) -> torch.Generator:
    """A CPU generator seeded by a hash of ``parts``: distinct for every (seed, epoch) pair, stable across runs."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def random_windows(ids: Tensor, context: int, count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``count`` random windows of ``ids``: inputs and targets, each (count, context), targets shifted by one."""
    starts = torch.randint(0, len(ids) - context, (count,), generator=generator)
    return windows_at(ids, starts, context)


def windows_at(ids: Tensor, starts: Tensor, context: int) -> tuple[Tensor, Tensor]:
    """Windows of ``context + 1`` ids from each of ``starts`` (n,): inputs (n, context) and targets (n, context)."""
    rows = ids[starts[:, None] + torch.arange(context + 1)]  # one gather instead of n slices
    return rows[:, :-1], rows[:, 1:]


def summed_loss(model: nn.Module, inputs: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy summed over every target token: (batch, seq) ids -> 0-d tensor (nats)."""
    logits = model(inputs)
    # float() keeps the softmax in float32 under bfloat16 autocast; it is a no-op in float32.
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="sum")


def check_split(ids: Tensor, context: int, split: str) -> None:
    """Refuse a split too short for one window of ``context`` inputs and their ``context`` targets."""
    if len(ids) <= context:
        hint = "; use a larger --val-fraction or a shorter context" if split == "validation" else ""
        raise AttnlabError(f"the {split} split holds {len(ids)} tokens, fewer than the context of {context} + 1{hint}")


@torch.no_grad()
def text_loss(model: nn.Module, ids: Tensor, *, context: int, batch_size: int = 64) -> float:
    """Mean loss in nats per token over every token of ``ids`` (1-D) but the first, which nothing predicts.

    Exact and deterministic, unlike :func:`evaluate_loss`'s estimate: the text is cut into consecutive windows of
    ``context`` targets (the last one shorter), each read from its own start, ``batch_size`` windows at a time.
    """
    if len(ids) < 2:
        raise AttnlabError(f"the text holds {len(ids)} token{'s' if len(ids) != 1 else ''}: scoring needs at least "
                           "2 (one to read, one to predict)")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    full = (len(ids) - 1) // context
    inputs, targets = ids[: full * context].view(full, context), ids[1 : full * context + 1].view(full, context)
    total = 0.0
    for start in range(0, full, batch_size):
        total += float(summed_loss(model, inputs[start : start + batch_size].to(device),
                                   targets[start : start + batch_size].to(device)))
    if full * context < len(ids) - 1:  # the tail, shorter than a context
        total += float(summed_loss(model, ids[full * context : -1][None].to(device),
                                   ids[full * context + 1 :][None].to(device)))
    model.train(was_training)
    return total / (len(ids) - 1)


@torch.no_grad()
def evaluate_loss(model: nn.Module, ids: Tensor, *, context: int, batch_size: int, iters: int,
                  seed: int = 0, stream: str = "eval", chunk: int = 256) -> float:
    """Mean loss in nats per token over ``iters`` random batches of ``batch_size`` windows (nanoGPT's estimate).

    All windows have ``context`` targets, so the mean over batches equals the mean over all windows;
    they are run ``chunk`` windows at a time (fewer, larger matmuls), which gives the same number.
    ``stream`` names the windows' generator with ``seed``: the same name, the same windows.
    """
    check_split(ids, context, "validation")
    was_training = model.training
    model.eval()
    g = seeded_generator(stream, seed)
    total, remaining = 0.0, iters * batch_size
    device = next(model.parameters()).device
    while remaining > 0:
        n = min(chunk, remaining)
        x, y = random_windows(ids, context, n, g)
        total += float(summed_loss(model, x.to(device), y.to(device)))
        remaining -= n
    model.train(was_training)
    return total / (iters * batch_size * context)


class LMTask:
    """Next-token prediction on random windows of a token stream (the engine's :class:`~attnlab.training.Task`).

    Args:
        train, val: 1-D id streams.
        context: window length (the model's ``max_positions`` or less).
        batch_size: windows per global batch (split across DDP processes).
        batches_per_epoch: how many batches make one "epoch" (only the unit of resumable randomness).
        seed: seeds the window positions together with the epoch.
        eval_iters, eval_batch_size: batches averaged by :meth:`evaluate` (``eval_batch_size`` defaults
            to ``batch_size``).
        selection_windows: the window stream of those evaluations (``"eval"`` in runs saved before the
            final figure had windows of its own).
    """

    def __init__(self, train: Tensor, val: Tensor, *, context: int, batch_size: int, batches_per_epoch: int = 1000,
                 seed: int = 0, eval_iters: int = 20, eval_batch_size: int | None = None,
                 selection_windows: str = "select") -> None:
        check_split(train, context, "training")
        check_split(val, context, "validation")  # said before training, not after it at the final evaluation
        if batch_size < 1 or context < 1 or eval_iters < 1:
            raise AttnlabError("batch size, context and eval iterations must be at least 1")
        self.train_ids, self.val_ids = train, val
        self.context, self.batch_size, self.batches_per_epoch = context, batch_size, batches_per_epoch
        self.seed, self.eval_iters = seed, eval_iters
        self.eval_batch_size = eval_batch_size or batch_size
        self.selection_windows = selection_windows  # the stream of evaluate_loss the evaluations draw from

    def batches(self, epoch: int, place: Place) -> Iterator[Batch]:
        """This process's batches of ``epoch``: (inputs, targets), each (batch_size / world, context)."""
        g = seeded_generator("train", self.seed, epoch)
        high = len(self.train_ids) - self.context
        # All of the epoch's starts at once: one generator call, and a given batch index always gets the
        # same windows however the epoch is iterated (a resume skips batches without drawing them).
        starts = torch.randint(0, high, (self.batches_per_epoch, self.batch_size), generator=g)
        for row in starts:
            mine = row[place.rank :: place.world]  # the same sharding as distributed.shard, on a tensor
            x, y = windows_at(self.train_ids, mine, self.context)
            yield Batch((x, y), count=y.numel(), tokens=x.numel())

    def loss(self, model: nn.Module, data: tuple[Tensor, Tensor]) -> Tensor:
        """Summed next-token cross-entropy of one batch (nats)."""
        return summed_loss(model, *data)

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """``val_loss`` in nats per token over ``eval_iters`` fixed random batches; ``score`` is its negative."""
        loss = evaluate_loss(model, self.val_ids, context=self.context, batch_size=self.eval_batch_size,
                             iters=self.eval_iters, seed=self.seed, stream=self.selection_windows)
        return {"loss": loss, "val_loss": loss, "score": -loss}


# ------------------------------------------------------------------------------------------------------
# cost figures


def flops_per_token(model: nn.Module, context: int) -> float:
    """Training FLOPs per token, as nanoGPT's ``estimate_mfu`` counts them (PaLM, appendix B).

    ``6 N`` for the matmuls (forward 2N, backward 4N; N excludes the position table, which is a lookup,
    and counts the tied output matrix once, as the logits matmul) plus ``12 L d T`` for attention's two
    matmuls over a context of T.
    """
    body = model.body  # a DecoderLM
    # A learned table's parameters are looked up, not multiplied; sinusoidal and rotary positions have none.
    positions = body.embed.positions
    n = model.num_parameters() - (sum(p.numel() for p in positions.parameters()) if positions is not None else 0)
    layers = len(body.layers)
    d = body.embed.tokens.embedding_dim
    return 6.0 * n + 12.0 * layers * d * context
