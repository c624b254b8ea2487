"""What the checks may feed a model: its kind, its pad id, its vocabulary and its longest sequence.

The checks only ever call a model on inputs inside this contract, so a model that raises on one of them
has a real bug (reported as a failed check), not a complaint about the tool.
"""

from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass
from typing import Any, Literal

from attnlab.errors import AttnlabError

Kind = Literal["encoder", "decoder", "seq2seq"]
KINDS: tuple[str, ...] = ("encoder", "decoder", "seq2seq")
#: Three distinct real tokens (plus the pad) are the fewest that let a reordering change a sequence of three.
MIN_VOCAB_SIZE = 4
#: order-sensitivity reorders two tokens before a third; padding-content needs two tokens and a pad column.
MIN_MAX_LENGTH = 3
#: Ids are drawn as int64 below vocab_size; any real vocabulary is far smaller than this.
MAX_VOCAB_SIZE = 2**31 - 1


@dataclass(frozen=True)
class Contract:
    """The inputs a model accepts.

    Attributes:
        kind: ``"encoder"`` or ``"decoder"``: ``model(ids)`` with ids (batch, seq); ``"seq2seq"``:
            ``model(src, tgt)`` with (batch, src_seq) and (batch, tgt_seq), outputs per target position.
        pad_id: the id that marks padding, always at the end of a row (right padding); ``None`` for a
            model that takes no padding, which skips the padding checks.
        vocab_size: ids are drawn from ``0 .. vocab_size - 1`` (never ``pad_id`` for a real token). For
            seq2seq it bounds both vocabularies: give the smaller one.
        max_length: the longest sequence the model accepts; no input is longer.
        empty_rows: whether a row made only of padding is a valid input (the finite check feeds one).
    """

    kind: Kind
    pad_id: int | None = 0
    vocab_size: int = 32
    max_length: int = 16
    empty_rows: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise AttnlabError(f"unknown model kind {self.kind!r}; use one of {', '.join(KINDS)}")
        for name in ("pad_id", "vocab_size", "max_length"):  # 8.5 would reach torch.randint as a bound
            value = getattr(self, name)
            if value is None and name == "pad_id":
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise AttnlabError(f"{name} must be a whole number{' or None' if name == 'pad_id' else ''}, "
                                   f"got {value!r}")
            object.__setattr__(self, name, int(value))  # numpy's integers too, stored as Python's (frozen class)
        if not MIN_VOCAB_SIZE <= self.vocab_size <= MAX_VOCAB_SIZE:
            raise AttnlabError(f"vocab size must be between {MIN_VOCAB_SIZE} and {MAX_VOCAB_SIZE:,} for the checks, "
                               f"got {self.vocab_size}")
        if self.max_length < MIN_MAX_LENGTH:
            raise AttnlabError(f"max length must be at least {MIN_MAX_LENGTH} for the checks, got {self.max_length}")
        if self.pad_id is not None and not 0 <= self.pad_id < self.vocab_size:
            raise AttnlabError(f"pad id {self.pad_id} is outside the vocabulary 0..{self.vocab_size - 1}")

    @property
    def causal(self) -> bool:
        """Whether the (target) side the outputs belong to must not see the future."""
        return self.kind in ("decoder", "seq2seq")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
