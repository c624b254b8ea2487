"""Calling a model as a black box: one adaptation of what it returns, no gradients, its mode.

Models are called under ``torch.no_grad()`` in eval mode, and with gradients on in train mode, as training calls
them (a model that takes another branch when autograd records, gradient checkpointing that drops the mask say,
is then checked on the branch training takes; nothing is ever backpropagated). PyTorch's inference fast path
(``torch.backends.mha``) is switched off, so they compute what training computes: without gradients (or with every
parameter frozen) ``nn.TransformerEncoderLayer`` and ``nn.MultiheadAttention`` otherwise take a fused path
that reads masks differently (a float 0/1 mask as a bool one, padding as nested tensors), and a mask bug
that leaks the future in training vanishes there. The ``inference-path`` check compares the two paths.

Models return a tensor, a tuple (attnlab's models with ``return_attention``, many hand-written ones),
or a Hugging Face ``ModelOutput``. :func:`output_tensor` is the only place that knows about these.

Two kinds of trouble are told apart, because they mean different things to the reader of a report: the
model raising (:class:`ModelRaised`, the model has a bug on an input it should accept) and the model
returning something the checks cannot use (:class:`OutputError`, the tool's own check of the output).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.checks.adapters import refuse_bare_encoder_decoder, warn_other_pad_id
from attnlab.checks.compare import TOLERANCE, Difference, Tolerance, difference
from attnlab.checks.contract import Contract

#: Fields of an output object that hold per-position outputs, in the order they are preferred.
OUTPUT_FIELDS = ("logits", "last_hidden_state")

#: What a side of an input is called in a report.
SIDES = {"ids": "ids", "src": "source", "tgt": "target"}


class OutputError(TypeError):
    """What the model returned breaks the calling contract (not a tensor, a wrong batch axis, a shape that
    changes between calls). Raised by attnlab's checks of the output, not by the model."""


class ModelRaised(Exception):
    """The model itself raised :attr:`error` when called (a finding about the model)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


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
    raise OutputError(
        f"the model returned {type(out).__name__}; expected a tensor, a tuple starting with one, "
        f"or an output with {' or '.join(OUTPUT_FIELDS)}"
    )


class ModelUnderTest:
    """A model and its contract, called the same way by every check.

    ``mut(ids)`` (encoder, decoder) or ``mut(src, tgt)`` (seq2seq) returns the output tensor, computed
    under ``torch.no_grad()`` in eval mode (gradients on in train mode) with the fast path off (``fast_path``; see
    the module docstring) on the model's
    device, with its batch axis checked, on the CPU. An
    exception of the model comes out as :class:`ModelRaised`, an unusable output as :class:`OutputError`.
    :attr:`last_input` holds the ids of the latest call so that either can be reported with its input.

    A bare Hugging Face encoder-decoder is refused here, with :class:`~attnlab.errors.AttnlabError` (see
    :func:`~attnlab.checks.adapters.refuse_bare_encoder_decoder`): every entry point builds one of these.
    """

    def __init__(self, model: Callable[..., Any], contract: Contract) -> None:
        refuse_bare_encoder_decoder(model, contract.kind)
        warn_other_pad_id(model, contract.pad_id)
        self.model, self.contract = model, contract
        # Inputs go to the device of the model's first parameter (CPU for anything else); outputs come
        # back to the CPU, where the checks compare them.
        first = next(model.parameters(), None) if isinstance(model, nn.Module) else None
        self.device = first.device if first is not None else torch.device("cpu")
        #: A model loaded under inference_mode holds inference tensors, which autograd cannot record and only
        #: inference_mode may update in place (batch norm's statistics in train mode): it is called in that mode.
        self.loaded_for_inference = isinstance(model, nn.Module) and any(
            t.is_inference() for t in (*model.parameters(), *model.buffers()))
        self.last_input: dict[str, list[list[int]]] = {}
        #: The seed the running check is on, for the evidence of an exception.
        self.seed: int | None = None
        #: Let torch take its inference fast path (off: the path training takes); see :meth:`with_fast_path`.
        self.fast_path = False
        #: When set, each call starts torch's random streams from this seed (:meth:`with_random_seed`).
        self.random_seed: int | None = None
        self._per_position: bool | None = None
        #: The output shapes the layout was decided from, for a report that needs them.
        self.layout_shapes: list[tuple[int, ...]] = []
        #: The dtype of the latest output (a half-precision one rounds past the comparing checks' tolerance).
        self.output_dtype: torch.dtype | None = None

    @contextmanager
    def with_random_seed(self, seed: int) -> Iterator[None]:
        """Calls inside start torch's random streams (CPU, and the model's GPU) from ``seed``, and leave the
        caller's streams as they were: in train mode two calls on inputs of one shape then draw the same
        dropout masks, so their outputs can be compared."""
        before, self.random_seed = self.random_seed, seed
        try:
            yield
        finally:
            self.random_seed = before

    @contextmanager
    def with_fast_path(self) -> Iterator[None]:
        """Calls inside may take torch's fused inference fast path, as ``no_grad`` inference does."""
        before, self.fast_path = self.fast_path, True
        try:
            yield
        finally:
            self.fast_path = before

    def __call__(self, ids: Tensor, tgt: Tensor | None = None) -> Tensor:
        """(batch, seq) ids, and for seq2seq (batch, tgt_seq) target ids -> the output tensor."""
        seq2seq = self.contract.kind == "seq2seq"
        if seq2seq != (tgt is not None):
            raise ValueError("seq2seq models take (src, tgt); other kinds take ids only")
        self.last_input = {"src": ids.tolist(), "tgt": tgt.tolist()} if tgt is not None else {"ids": ids.tolist()}
        # Copies: a model that edits its ids in place must not change the inputs the checks compare and report.
        if tgt is not None:
            return self.invoke(lambda: self.model(ids.to(self.device, copy=True), tgt.to(self.device, copy=True)),
                               rows=ids.shape[0])
        return self.invoke(lambda: self.model(ids.to(self.device, copy=True)), rows=ids.shape[0])

    def invoke(self, call: Callable[[], Any], *, rows: int) -> Tensor:
        """The output tensor of ``call()``, a call of the model (or of one of its methods), made as every check
        makes it: under ``no_grad`` (gradients on when the model is in train mode, as in training), on the path
        training takes (or the fast path, see :meth:`with_fast_path`), its exceptions as :class:`ModelRaised`, its
        output checked to have ``rows`` rows and moved to the CPU."""
        grad = getattr(self.model, "training", False) and not self.loaded_for_inference
        calling = torch.inference_mode() if self.loaded_for_inference else torch.set_grad_enabled(grad)
        with calling, _fast_path(self.fast_path), self._random_streams():
            try:
                raw = call()
            except KeyboardInterrupt:
                raise
            except BaseException as err:  # SystemExit too: a model that exits is a finding, not the end of the run
                raise ModelRaised(err) from err
        out = output_tensor(raw)
        if out.is_meta:
            raise OutputError("the output is a meta tensor, which holds no values: are the model's weights still on "
                              "the meta device, never loaded?")
        if out.dim() == 0 or out.shape[0] != rows:
            raise OutputError(f"the output has shape {tuple(out.shape)}, but the batch has {rows} "
                              f"row{'s' if rows != 1 else ''}")
        if out.is_complex():  # comparing it as real numbers would drop the imaginary part unseen
            raise OutputError(f"the output is complex ({out.dtype}); the checks compare real numbers: return its real "
                              "and imaginary parts side by side (torch.view_as_real)")
        if out.numel() == 0:  # every comparison of nothing would pass
            raise OutputError(f"the output has shape {tuple(out.shape)}: it holds no values to compare")
        self.output_dtype = out.dtype
        return out.detach().cpu()

    @contextmanager
    def _random_streams(self) -> Iterator[None]:
        if self.random_seed is None:
            yield
            return
        # manual_seed reseeds every GPU: fork all of them, so that the caller's streams are all given back.
        with torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []):
            torch.manual_seed(self.random_seed)
            yield

    def input_summary(self) -> str:
        """The latest input in words, e.g. ``ids of shape (2, 100) with row lengths 57, 100``: a length a row,
        in the batch's order, counting the ids that are not the pad id, so a model that overruns its positions
        is easy to spot."""
        pad, parts = self.contract.pad_id, []
        for side, rows in self.last_input.items():
            width = len(rows[0]) if rows else 0
            lengths = [sum(t != pad for t in row) for row in rows]
            parts.append(f"{SIDES[side]} of shape ({len(rows)}, {width}) with row lengths "
                         f"{', '.join(map(str, lengths))}")
        return "; ".join(parts)

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
        output whose size happens to equal one length cannot follow both. A seq2seq model gets a source of the
        other length each time (3 then 2 against a target of 2 then 3): an output that follows the source is an
        :class:`OutputError` (the arguments taken as (tgt, src), or no seq2seq model at all), where equal lengths
        had it checked as per-position and failed with messages that contradicted each other.
        """
        if self._per_position is None:
            # The probe's inputs are the same whatever the seed: an exception here is reported without one.
            follows, sources, self.layout_shapes, seed, self.seed = [], [], [], self.seed, None
            token = 1 if self.contract.pad_id != 1 else 2
            for length in (2, 3):
                ids = torch.full((2, length), token, dtype=torch.long)
                if self.contract.kind == "seq2seq":
                    out = self(torch.full((2, 5 - length), token, dtype=torch.long), ids)
                    sources.append(out.dim() >= 2 and out.shape[1] == 5 - length)
                else:
                    out = self(ids)
                self.layout_shapes.append(tuple(out.shape))
                follows.append(out.dim() >= 2 and out.shape[1] == length)
            offsets = {shape[1] - length if len(shape) >= 2 else None
                       for shape, length in zip(self.layout_shapes, (2, 3))}
            if len(offsets) == 1 and offsets - {0, None} and not (sources and all(sources)):
                offset = offsets.pop()
                raise OutputError(f"the output has {abs(offset)} position(s) {'more' if offset > 0 else 'fewer'} "
                                  f"than the input (shapes {', '.join(map(str, self.layout_shapes))} for "
                                  f"{'targets' if sources else 'inputs'} of 2 and 3 positions): a token added inside "
                                  "the model (a [CLS] in front?) or positions dropped; the checks compare outputs "
                                  "position by position with the input: return one output per input position, or a "
                                  "pooled output (batch, features)")
            if sources and all(sources):
                raise OutputError(f"the output follows the source's length, not the target's (shapes "
                                  f"{', '.join(map(str, self.layout_shapes))} for sources of 3 and 2 positions, "
                                  "targets of 2 and 3): a seq2seq model is called model(src, tgt); does it take "
                                  "them in another order, or is it a seq2seq model at all (--kind)?")
            self._per_position, self.seed = all(follows), seed
        return self._per_position

    def positions(self, out: Tensor, row: int, length: int) -> Tensor:
        """Row ``row``'s outputs on its first ``length`` positions, or its pooled output."""
        return out[row, :length] if self.per_position else out[row]

    def compare(self, a: Tensor, b: Tensor, tolerance: Tolerance = TOLERANCE) -> Difference:
        """:func:`~attnlab.checks.compare.difference` of two of one row's outputs, positions named if any."""
        if a.shape != b.shape:
            raise OutputError(f"one row's outputs have shapes {tuple(a.shape)} and {tuple(b.shape)} in two calls; "
                              + ("only the batch and position axes may change with the input" if self.per_position
                                 else "the output does not follow the input's length, so it is taken as pooled, "
                                 "(batch, features), whose size may not change with the input"))
        return difference(a, b, position_dims=1 if self.per_position else 0, tolerance=tolerance)


#: Whether this torch can switch its MultiheadAttention / TransformerEncoder fast path (torch >= 2.3 can).
FAST_PATH_SWITCH = hasattr(torch.backends, "mha") and hasattr(torch.backends.mha, "set_fastpath_enabled")

#: The fast-path flag is process-wide: :func:`~attnlab.checks.runner.run_checks` holds this lock while it
#: runs, so that checks in two threads cannot interleave their switching.
FAST_PATH_LOCK = threading.RLock()


@contextmanager
def _fast_path(enabled: bool) -> Iterator[None]:
    """Switch torch's MultiheadAttention / TransformerEncoder fast path on or off, and back afterwards."""
    if not FAST_PATH_SWITCH:
        yield
        return
    with FAST_PATH_LOCK:
        before = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(enabled)
        try:
            yield
        finally:
            torch.backends.mha.set_fastpath_enabled(before)


def unpassed_mask_parameters(model: Any, *, seq2seq: bool = False) -> list[str]:
    """The parameters of the model's ``forward`` (or of a plain callable) that name a padding mask and have a
    default.

    The checks call ``model(ids)`` (``model(src, tgt)`` for seq2seq) and never pass them, so a model that relies
    on its caller for the padding mask, as a Hugging Face ``attention_mask=None`` does, runs without one: the
    padding checks name them when they fail. Flags (``mask_future``) and head masks are not padding masks, nor
    is a cross-attention's (``memory_key_padding_mask``, ``encoder_attention_mask``) but for ``seq2seq``.
    """
    try:
        signature = inspect.signature(model.forward if isinstance(model, nn.Module) else model)
    except (TypeError, ValueError):  # builtins and some C extensions have none
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    cross = ("encoder_", "memory_", "cross")
    return [p.name for p in signature.parameters.values()
            if p.kind in kinds and p.default is not inspect.Parameter.empty and p.name.lower().endswith("mask")
            and "head_mask" not in p.name.lower() and (seq2seq or not p.name.lower().startswith(cross))]


@contextmanager
def mode(model: Any, *, training: bool) -> Iterator[bool]:
    """Put an ``nn.Module`` in train or eval mode, and restore every submodule's own mode afterwards.

    Yields whether the mode could be set (False for a plain callable, which is left alone).
    """
    if not isinstance(model, nn.Module):
        yield False
        return
    # (a frozen TorchScript module has no ``training`` until train() sets one: it is taken away again after)
    saved = [(m, getattr(m, "training", None)) for m in model.modules()]
    model.train(training)
    try:
        yield True
    finally:
        for module, was_training in saved:
            if was_training is None:
                module.__dict__.pop("training", None)
            else:
                module.training = was_training
