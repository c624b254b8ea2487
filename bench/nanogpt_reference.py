"""nanoGPT's character-level Shakespeare CPU recipe, re-created as one plain PyTorch script (issue 6's yardstick).

nanoGPT cannot be fetched on this machine, so this script rebuilds what its ``train.py`` does for the CPU command
of its README (``--device=cpu --compile=False --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12
--n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0`` on top of
``config/train_shakespeare_char.py``), written here from its documented design, so that attnlab's presets can
be timed against it *in the same run on the same machine*:

* data: the characters of the whole file, sorted, as the vocabulary; the first 90% trains, the last 10%
  validates; a batch is ``batch_size`` windows at uniformly random offsets, targets shifted by one;
* model: GPT-2 blocks (pre-norm, LayerNorm and Linear without biases, fused causal
  ``scaled_dot_product_attention``, GELU MLP of width 4d), learned positions, tied output matrix, weights from
  N(0, 0.02) with the residual projections scaled by 1/sqrt(2 * layers);
* optimiser: AdamW (0.9, 0.99), weight decay 0.1 on matrices only, learning rate 1e-3 with 100 linear warmup
  iterations and cosine decay to 1e-4 at 2,000, gradient clipping at 1.0, float32, torch's default threads;
* evaluation at iteration 0 and every 250: the mean loss of 20 random batches of each split (its
  ``estimate_loss``), and ``loss.item()`` logged on every iteration (``log_interval=1``).

Prints one JSON object: wall time (data reading to the last evaluation), steady training tokens/s (median over
windows of 10 iterations after the first, evaluations excluded), the final validation estimate, and the same
200-batch validation estimate attnlab's runs report. Not a test; run it on an idle machine.

    python bench/nanogpt_reference.py [--text PATH] [--iters 2000] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bench_args import at_least

DEFAULT_TEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare" / "input.txt"


class SelfAttention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width, bias=False), nn.LayerNorm(width, bias=False)
        self.attn = SelfAttention(width, heads)
        self.up, self.down = nn.Linear(width, 4 * width, bias=False), nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, context: int, layers: int, heads: int, width: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width, bias=False)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "down.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    parser.add_argument("--iters", type=at_least(1), default=2000)
    parser.add_argument("--threads", type=at_least(0), default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=1337)
    args = parser.parse_args()
    if not args.text.is_file():
        raise SystemExit(f"error: no text file {args.text} (tinyshakespeare's input.txt)")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    batch, context, layers, heads, width = 12, 64, 4, 4, 128
    lr, min_lr, warmup, decay_iters, eval_interval, eval_iters = 1e-3, 1e-4, 100, args.iters, 250, 20

    start = time.perf_counter()
    text = args.text.read_text(encoding="utf-8")
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([index[c] for c in text], dtype=torch.long)
    cut = int(0.9 * len(data))
    splits = {"train": data[:cut], "val": data[cut:]}

    def get_batch(split: str, size: int = batch) -> tuple[torch.Tensor, torch.Tensor]:
        d = splits[split]
        ix = torch.randint(len(d) - context, (size,))
        return torch.stack([d[i:i + context] for i in ix]), torch.stack([d[i + 1:i + 1 + context] for i in ix])

    model = GPT(len(chars), context, layers, heads, width)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=lr, betas=(0.9, 0.99))

    def lr_at(it: int) -> float:
        if it < warmup:
            return lr * (it + 1) / (warmup + 1)
        if it > decay_iters or decay_iters <= warmup:  # (a run no longer than its warmup has no decay)
            return min_lr
        ratio = (it - warmup) / (decay_iters - warmup)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)

    @torch.no_grad()
    def estimate(split: str, iters: int) -> float:
        model.eval()
        losses = [model(*get_batch(split)).item() for _ in range(iters)]
        model.train()
        return sum(losses) / len(losses)

    train_seconds, window, rates, val = 0.0, [], [], float("nan")
    x, y = get_batch("train")
    for it in range(args.iters + 1):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(it)
        if it % eval_interval == 0 or it == args.iters:  # (nanoGPT's own 2,000 end on an evaluation too)
            val = estimate("val", eval_iters)
            estimate("train", eval_iters)
        if it == args.iters:
            break
        begin = time.perf_counter()
        loss = model(x, y)
        x, y = get_batch("train")  # the next batch, fetched while nanoGPT's GPU would still be busy
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()  # log_interval=1: every iteration reads its loss
        elapsed = time.perf_counter() - begin
        train_seconds += elapsed
        window.append(elapsed)
        if len(window) == 10:
            rates.append(10 * batch * context / sum(window))
            window = []
    wall = time.perf_counter() - start
    torch.manual_seed(args.seed + 1)  # the 200-batch estimate attnlab's runs report, on fresh windows
    val200 = estimate("val", 200)
    print(json.dumps({
        "wall_seconds": wall, "train_seconds": train_seconds, "iters": args.iters,
        # (fewer than 10 iterations make no window: their mean rate stands in)
        "steady_tokens_per_second": statistics.median(rates[1:] or rates or [args.iters * batch * context / train_seconds]),
        "tokens_per_second": args.iters * batch * context / train_seconds,
        "val_loss": val, "val_loss_200": val200, "threads": torch.get_num_threads(),
    }))


if __name__ == "__main__":
    main()
