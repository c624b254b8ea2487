"""Benchmark: one attnlab encoder layer against torch.nn.TransformerEncoderLayer, same configuration.

d_model 512, 8 heads, d_ff 2048, batch 32 x 128 tokens, float32, CPU, dropout 0.1 (train) / eval. torch's layer
also drops out inside its feed-forward block (between the two linear maps, on a 4x wider tensor), which the paper
and attnlab's layer do not: it is replaced by an identity here, so that both layers do the same work. Both layers are timed alternately in the same run, so machine noise hits both alike; the script prints
the median times and the ratio torch_time / attnlab_time (>= 1.0 means attnlab is not slower).

    python bench/encoder_layer.py [--repeats 10] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from attnlab.nn import EncoderLayer
from bench_args import at_least


def timed(fn, *args) -> float:
    """Seconds one call of ``fn(*args)`` takes."""
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=at_least(1), default=10)
    parser.add_argument("--threads", type=at_least(0), default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--batch", type=at_least(1), default=32)
    parser.add_argument("--seq", type=at_least(1), default=128)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    d, heads, ff = 512, 8, 2048
    ours = EncoderLayer(d, heads, ff, dropout=0.1, eps=1e-5)
    theirs = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.1, batch_first=True)
    theirs.dropout = nn.Identity()  # its feed-forward's inner dropout (see above); dropout1 and dropout2 stay
    x = torch.randn(args.batch, args.seq, d)

    def train_step(layer, call):
        layer.train()
        layer.zero_grad(set_to_none=True)
        call(layer, x).sum().backward()

    def forward_only(layer, call):
        layer.eval()
        with torch.inference_mode():
            call(layer, x)

    def call_ours(layer, inp):
        return layer(inp)[0]

    def call_theirs(layer, inp):
        return layer(inp)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, x {tuple(x.shape)} float32; torch's "
          "feed-forward inner dropout off (attnlab's layer has none)")
    for name, step in (("forward+backward (train)", train_step), ("forward only (eval, inference_mode)", forward_only)):
        for _ in range(2):  # warm-up
            step(ours, call_ours)
            step(theirs, call_theirs)
        t_ours, t_theirs = [], []
        for _ in range(args.repeats):  # alternate so that noise hits both alike
            t_ours.append(timed(step, ours, call_ours))
            t_theirs.append(timed(step, theirs, call_theirs))
        a, b = statistics.median(t_ours), statistics.median(t_theirs)
        print(f"{name:38s} attnlab {a * 1e3:8.1f} ms   torch.nn {b * 1e3:8.1f} ms   ratio torch/attnlab {b / a:5.2f}")


if __name__ == "__main__":
    main()
