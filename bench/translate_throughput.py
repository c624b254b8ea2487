"""Benchmark: training tokens per second of ``attnlab train translate`` against a plain ``torch.nn.Transformer`` loop.

Both train the same shape on Multi30k German->English (the recipe's d 256, 3+3 layers, 4 heads, ff 1024,
joint BPE, shared and tied embeddings, label smoothing 0.1, AdamW, dropout 0.1) and are timed in
alternating rounds of a few steps each, so the noise of a shared machine hits both alike. Three loops:

* ``attnlab``: the real engine step (``Trainer._step``) on the task's length-bucketed token batches;
* ``plain``: the plain recipe, ``torch.nn.Transformer`` on random batches of ``--plain-batch`` sentences,
  loss over all positions with ``ignore_index`` (what most tutorials do);
* ``nn-bucketed``: ``torch.nn.Transformer`` fed the very batches the ``attnlab`` loop trains on, in the same
  order (isolates the model from batching).

The three optimisers are the same AdamW implementation (``fused=True``, the engine's), so that the ratios compare
models and batching. The defaults are the Multi30k recipe's (``bench/multi30k.sh``): a joint BPE vocabulary of
8,000 and batches of at most 2,000 padded positions a side. Each loop cycles through epochs as long as the rounds
ask. Tokens are *real* tokens: source tokens (with eos) plus predicted target tokens (with eos), never padding.

    python bench/translate_throughput.py [--data ../shared/data/multi30k] [--rounds 4] [--steps 6] [--threads N]
                                         [--vocab-size 8000] [--max-tokens 2000] [--plain-batch 128]
"""

from __future__ import annotations

import argparse
import itertools
import math
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.data import PAD_ID, BPETokenizer
from attnlab.errors import AttnlabError
from attnlab.tasks.parallel_data import collate, encode_pairs, read_parallel, real_tokens, token_batches
from attnlab.tasks.translate import (
    RECIPE_MODEL,
    RECIPE_TRAIN,
    TranslateSettings,
    TranslationTask,
    build_translation_model,
)
from attnlab.training import TrainConfig, Trainer
from bench_args import at_least


class PlainTransformer(nn.Module):
    """The plain recipe: shared embedding x sqrt(d) + sinusoidal positions -> nn.Transformer -> tied output."""

    def __init__(self, vocab: int, d: int, heads: int, layers: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.d, self.dropout = d, dropout
        self.embed = nn.Embedding(vocab, d, padding_idx=PAD_ID)
        self.body = nn.Transformer(d, heads, layers, layers, d_ff, dropout, batch_first=True)
        self.out = nn.Linear(d, vocab)
        self.out.weight = self.embed.weight
        pos = torch.arange(512)[:, None]
        div = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
        pe = torch.zeros(512, d)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
        self.register_buffer("pe", pe, persistent=False)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.dropout(self.embed(ids) * math.sqrt(self.d) + self.pe[: ids.shape[1]], self.dropout, self.training)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        # torch's convention: True = hidden (attnlab's attend masks are the opposite).
        causal = torch.ones(tgt.shape[1], tgt.shape[1], dtype=torch.bool).triu(1)
        pad_src, pad_tgt = src == PAD_ID, tgt == PAD_ID
        states = self.body(self._embed(src), self._embed(tgt), tgt_mask=causal, src_key_padding_mask=pad_src,
                           tgt_key_padding_mask=pad_tgt, memory_key_padding_mask=pad_src)
        return self.out(states)


def plain_step(model: nn.Module, opt: torch.optim.Optimizer, data: dict[str, torch.Tensor]) -> int:
    """One optimiser step of the plain loop; returns the real tokens it trained on."""
    model.train()
    logits = model(data["src"], data["tgt_in"])
    count = real_tokens(data["tgt_out"])
    loss = F.cross_entropy(logits.flatten(0, 1), data["tgt_out"].flatten(), ignore_index=PAD_ID, label_smoothing=0.1)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return real_tokens(data["src"]) + count


def endless(epoch_batches: Callable[[int], list[list[int]]]) -> Iterator[list[int]]:
    """The batches of epoch 0, then of epoch 1, and so on: a loop never runs out however many rounds it is given."""
    for epoch in itertools.count():
        yield from epoch_batches(epoch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared/data/multi30k"))
    parser.add_argument("--rounds", type=at_least(1), default=4, help="alternating rounds")
    parser.add_argument("--steps", type=at_least(1), default=6, help="optimizer steps per loop per round")
    parser.add_argument("--vocab-size", type=at_least(8), default=8000, help="joint BPE vocabulary (the recipe's)")
    parser.add_argument("--max-tokens", type=at_least(1), default=2000,
                        help="padded positions a side per bucketed batch (the recipe's)")
    parser.add_argument("--plain-batch", type=at_least(1), default=128, help="sentences per batch of the plain loop")
    parser.add_argument("--threads", type=at_least(0), default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(tempfile.mkdtemp(prefix="attnlab-throughput-"))  # the engine's run folder; nothing in it is kept
    try:
        measure(args, out)
    except AttnlabError as error:  # a missing data folder, a vocabulary the text cannot give: one line
        raise SystemExit(f"error: {error}") from None
    finally:
        shutil.rmtree(out, ignore_errors=True)


def measure(args: argparse.Namespace, out: Path) -> None:
    """Train the three loops in alternating rounds and print their rates and ratios."""
    src, tgt = read_parallel(Path(args.data) / "train", "de", "en")
    tok = BPETokenizer.train(src + tgt, vocab_size=args.vocab_size)
    m = RECIPE_MODEL
    pairs = encode_pairs(tok.encode_batch(src), tok.encode_batch(tgt), m["max_src_positions"], m["max_tgt_positions"], "train")
    settings = TranslateSettings(vocab_size=args.vocab_size, max_tokens=args.max_tokens)

    torch.manual_seed(0)
    ours = build_translation_model((tok.vocab_size, tok.vocab_size), RECIPE_MODEL, share_embeddings=True, tie_output=True)
    task = TranslationTask(pairs, pairs, [], [], tok, settings)
    config = TrainConfig(**{**RECIPE_TRAIN, "progress": False, "device": "cpu"})
    trainer = Trainer(ours, task, config, out)
    batches = trainer._micro_batches()

    def plain_model() -> tuple[nn.Module, torch.optim.Optimizer]:
        model = PlainTransformer(tok.vocab_size, m["d_model"], m["num_heads"], m["num_layers"], m["d_ff"], m["dropout"])
        return model, torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), fused=True)

    plain, plain_opt = plain_model()
    bucketed, bucketed_opt = plain_model()

    def random_epoch(epoch: int) -> list[list[int]]:
        order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(epoch)).tolist()
        return [order[i : i + args.plain_batch] for i in range(0, len(order), args.plain_batch)]

    def bucketed_epoch(epoch: int) -> list[list[int]]:  # the task's own batches, in the order the engine takes them
        return token_batches(pairs, max_tokens=args.max_tokens, seed=task.seed, epoch=epoch)

    random_batches, our_batches = endless(random_epoch), endless(bucketed_epoch)

    def run_attnlab() -> int:
        _, tokens = trainer._step([next(batches)])
        return tokens

    loops = {
        "attnlab": run_attnlab,
        "plain": lambda: plain_step(plain, plain_opt, collate(pairs, next(random_batches))),
        "nn-bucketed": lambda: plain_step(bucketed, bucketed_opt, collate(pairs, next(our_batches))),
    }
    for fn in loops.values():  # warm-up: allocator, kernels, first batches
        fn()
    rates: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(args.rounds):
        for name, fn in loops.items():
            start, tokens = time.perf_counter(), 0
            for _ in range(args.steps):
                tokens += fn()
            rates[name].append(tokens / (time.perf_counter() - start))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, vocab {tok.vocab_size}, batches of "
          f"{args.max_tokens} positions (bucketed) and {args.plain_batch} sentences (plain), {args.rounds} rounds x "
          f"{args.steps} steps per loop; real (non-padding) tokens per second")
    for name, values in rates.items():
        print(f"  {name:<12} median {statistics.median(values):8.0f} tok/s   rounds: "
              + ", ".join(f"{v:.0f}" for v in values))
    ours_rate = statistics.median(rates["attnlab"])
    print(f"ratio attnlab / plain:       {ours_rate / statistics.median(rates['plain']):.2f}")
    print(f"ratio attnlab / nn-bucketed: {ours_rate / statistics.median(rates['nn-bucketed']):.2f}")
    # Tutorials often count padded positions as tokens: the same rates in that unit, from the batches' padding.
    random_share = padding_share(pairs, random_epoch(0))
    bucketed_share = padding_share(pairs, bucketed_epoch(0))
    print(f"padding: {random_share:.0%} of the positions of random {args.plain_batch}-sentence batches, "
          f"{bucketed_share:.0%} of the bucketed ones; counted with padding, plain trains at "
          f"{statistics.median(rates['plain']) / (1 - random_share):.0f} positions/s and attnlab at "
          f"{ours_rate / (1 - bucketed_share):.0f}")
    sys.stdout.flush()


def padding_share(pairs, batches: list[list[int]]) -> float:
    """Share of padded positions (source + target output) over all of ``batches``."""
    padded = real = 0
    for index in batches:
        data = collate(pairs, index)
        padded += data["src"].numel() + data["tgt_out"].numel()
        real += real_tokens(data["src"]) + real_tokens(data["tgt_out"])
    return 1 - real / padded


if __name__ == "__main__":
    main()
