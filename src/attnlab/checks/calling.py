"""Calling a model as a black box: one adaptation of what it returns, no gradients, its mode.

Models return a tensor, a tuple (attnlab's models with ``return_attention``, many hand-written ones),
or a Hugging Face ``ModelOutput``. :func:`output_tensor` is the only place that knows about these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.checks.compare import Difference, difference
from attnlab.checks.contract import Contract

#: Fields of an output object that hold per-position outputs, in the order they are preferred.
OUTPUT_FIELDS = ("logits", "last_hidden_state")


def output_tensor(out: Any) -> Tensor:
    """The tensor a model's return value stands for.

    A tensor is itself; a tuple or list gives its first element; an object or mapping with ``logits``
    (a Hugging Face LM) or ``last_hidden_state`` (a Hugging Face encoder) gives that field.
    """
    if isinstance(out, Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], Tensor):
        return out[0]
    for name in OUTPUT_FIELDS:
        value = out.get(name) if isinstance(out, Mapping) else getattr(out, name, None)
        if isinstance(value, Tensor):
            return value
    raise TypeError(
        f"the model returned {type(out).__name__}; expected a tensor, a tuple starting with one, "
        f"or an output with {' or '.join(OUTPUT_FIELDS)}"
    )


class ModelUnderTest:
    """A model and its contract, called the same way by every check.

    ``mut(ids)`` (encoder, decoder) or ``mut(src, tgt)`` (seq2seq) returns the output tensor, computed
    under ``torch.no_grad()`` on the model's device, with its batch axis checked, on the CPU. :attr:`last_input` holds the ids of the
    latest call so that an exception can be reported with the input that raised it.
    """

    def __init__(self, model: Callable[..., Any], contract: Contract) -> None:
        self.model, self.contract = model, contract
        # Inputs go to the device of the model's first parameter (CPU for anything else); outputs come
        # back to the CPU, where the checks compare them.
        first = next(model.parameters(), None) if isinstance(model, nn.Module) else None
        self.device = first.device if first is not None else torch.device("cpu")
        self.last_input: dict[str, list[list[int]]] = {}
        #: The seed the running check is on, for the evidence of an exception.
        self.seed: int | None = None
        self._per_position: bool | None = None

    def __call__(self, ids: Tensor, tgt: Tensor | None = None) -> Tensor:
        """(batch, seq) ids, and for seq2seq (batch, tgt_seq) target ids -> the output tensor."""
        seq2seq = self.contract.kind == "seq2seq"
        if seq2seq != (tgt is not None):
            raise ValueError("seq2seq models take (src, tgt); other kinds take ids only")
        self.last_input = {"src": ids.tolist(), "tgt": tgt.tolist()} if tgt is not None else {"ids": ids.tolist()}
        with torch.no_grad():
            ids_on = ids.to(self.device)
            out = output_tensor(self.model(ids_on, tgt.to(self.device)) if tgt is not None else self.model(ids_on))
        if out.dim() == 0 or out.shape[0] != ids.shape[0]:
            raise TypeError(f"the output has shape {tuple(out.shape)}, but the batch has {ids.shape[0]} rows")
        return out.detach().cpu()

    def outputs(self, ids: Tensor, src: Tensor | None = None) -> Tensor:
        """Outputs for ``ids`` on the output side: the ids of an encoder or decoder, the target of a
        seq2seq model (whose source is then ``src``)."""
        return self(src, ids) if src is not None else self(ids)

    @property
    def detected_per_position(self) -> bool | None:
        """The output layout if a check has found it already, else None (the model raised first)."""
        return self._per_position

    @property
    def per_position(self) -> bool:
        """Whether outputs are per (target) position, (batch, seq, ...), rather than pooled, (batch, ...).

        Decided by calling the model on two lengths: per-position outputs follow the length. A pooled
        output whose size happens to equal one length cannot follow both.
        """
        if self._per_position is None:
            follows = []
            for length in (2, 3):
                ids = torch.full((2, length), 1 if self.contract.pad_id != 1 else 2, dtype=torch.long)
                out = self(ids, ids) if self.contract.kind == "seq2seq" else self(ids)
                follows.append(out.dim() >= 2 and out.shape[1] == length)
            self._per_position = all(follows)
        return self._per_position

    def positions(self, out: Tensor, row: int, length: int) -> Tensor:
        """Row ``row``'s outputs on its first ``length`` positions, or its pooled output."""
        return out[row, :length] if self.per_position else out[row]

    def compare(self, a: Tensor, b: Tensor) -> Difference:
        """:func:`~attnlab.checks.compare.difference` of two of one row's outputs, positions named if any."""
        return difference(a, b, position_dims=1 if self.per_position else 0)


@contextmanager
def mode(model: Any, *, training: bool) -> Iterator[bool]:
    """Put an ``nn.Module`` in train or eval mode, and restore every submodule's own mode afterwards.

    Yields whether the mode could be set (False for a plain callable, which is left alone).
    """
    if not isinstance(model, nn.Module):
        yield False
        return
    saved = [(m, m.training) for m in model.modules()]
    model.train(training)
    try:
        yield True
    finally:
        for module, was_training in saved:
            module.training = was_training
