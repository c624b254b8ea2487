"""Per-layer parameter counts, the PyTorch counterpart of Keras's ``model.summary()`` (seed 003).

Rows are the building blocks a reader thinks in (embeddings, encoder and decoder layers, the output
projection), or, with ``expand=True``, the sub-layers inside each layer (attention, feed-forward, norms).
A parameter shared by two modules (tied embeddings) is counted once, where it first appears.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.layers import DecoderLayer, EncoderLayer, FeedForward

_LAYERS = (EncoderLayer, DecoderLayer)
_SUBLAYERS = (MultiHeadAttention, FeedForward, nn.LayerNorm)


@dataclass(frozen=True)
class SummaryRow:
    """One row: the module's dotted name, its class, its own parameters and a note (e.g. tying)."""

    name: str
    kind: str
    parameters: int
    note: str = ""


def summarize(model: nn.Module, *, expand: bool = False) -> list[SummaryRow]:
    """Rows for ``model``; their ``parameters`` add up to the model's distinct trainable parameters."""
    stop = _SUBLAYERS if expand else _LAYERS
    seen: dict[int, str] = {}
    rows: list[SummaryRow] = []

    def visit(name: str, module: nn.Module) -> None:
        children = list(module.named_children())
        if isinstance(module, stop) or not children:
            own, tied = 0, []
            for p in module.parameters():
                if not p.requires_grad:
                    continue
                if id(p) in seen:
                    tied.append(seen[id(p)])
                else:
                    seen[id(p)] = name
                    own += p.numel()
            if own or tied:
                note = "tied to " + ", ".join(sorted(set(tied))) if tied else ""
                rows.append(SummaryRow(name, type(module).__name__, own, note))
            return
        for child_name, child in children:
            visit(f"{name}.{child_name}" if name else child_name, child)

    visit("", model)
    return rows


def total_parameters(rows: list[SummaryRow]) -> int:
    """Sum of the rows' parameters."""
    return sum(r.parameters for r in rows)
