"""Running the checks: each one in eval mode (except ``mode``), each model exception a failed check."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import CodeType
from typing import Any

import torch
from torch import nn

from attnlab.checks.batch import check_batch_independence
from attnlab.checks.calling import FAST_PATH_LOCK, ModelRaised, ModelUnderTest, OutputError, mode
from attnlab.checks.causal import check_causal
from attnlab.checks.compare import EPS_FACTOR, TOLERANCE
from attnlab.checks.contract import Contract
from attnlab.checks.finite import check_finite_outputs
from attnlab.checks.inference import check_inference_path
from attnlab.checks.kv_cache import check_kv_cache
from attnlab.checks.mode import check_mode, eval_randomness
from attnlab.checks.order import check_order_sensitivity
from attnlab.checks.padding import check_padding_content, check_padding_invariance
from attnlab.checks.report import CheckReport
from attnlab.checks.result import CheckResult
from attnlab.errors import AttnlabError, in_one_line

CheckFn = Callable[[ModelUnderTest, Sequence[int]], CheckResult]
#: Python's own words for a call with the wrong inputs (not a TypeError that torch raises inside the model).
_WRONG_ARITY = re.compile(r"takes (from \d+ to )?\d+ positional arguments? but \d+ (were|was) given"
                          r"|missing \d+ required (positional|keyword-only)")

#: Every check by name, in the order they run and are reported.
CHECKS: dict[str, CheckFn] = {
    "causal": check_causal,
    "padding-invariance": check_padding_invariance,
    "padding-content": check_padding_content,
    "batch-independence": check_batch_independence,
    "order-sensitivity": check_order_sensitivity,
    "finite-outputs": check_finite_outputs,
    "mode": check_mode,
    "inference-path": check_inference_path,
    "kv-cache": check_kv_cache,
}

#: The checks that compare two kernels (fused against written out, cached against whole), with a tolerance widened
#: to a few epsilons of a half-precision output (:meth:`~attnlab.checks.compare.Tolerance.for_kernels`).
KERNEL_COMPARING = ("inference-path", "kv-cache")
#: The checks that compare two calls of the model, which random outputs in eval mode would fail for nothing.
COMPARING = ("causal", "padding-invariance", "padding-content", "batch-independence", "order-sensitivity",
             "inference-path", "kv-cache")


def seed_list(seeds: int | Iterable[int]) -> list[int]:
    """``5`` -> ``[0, 1, 2, 3, 4]``; an iterable of seeds is taken as it is."""
    out = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    if not out:
        raise AttnlabError("the checks need at least one seed")
    return out


def run_check(name: str, mut: ModelUnderTest, seeds: Sequence[int]) -> CheckResult:
    """One check. The model raising, or returning what the checks cannot use, is a failed check that
    says which of the two it was and quotes the input (seed, shape, row lengths)."""
    if name not in CHECKS:
        raise AttnlabError(f"unknown check {name!r}; the checks are {', '.join(CHECKS)}")
    mut.seed, mut.last_input = None, {}
    try:
        if name == "mode":  # switches the mode itself
            return CHECKS[name](mut, seeds)
        with mode(mut.model, training=False):
            return _rounding_noted(CHECKS[name](mut, seeds), mut)
    except ModelRaised as raised:  # the model raised on an input inside its contract: that is the finding
        err = raised.error
        what = f"the model raised {in_one_line(err)}"
        c = mut.contract
        if isinstance(err, IndexError):  # nearly always an embedding table smaller than the ids drawn
            what += (f" [ids are drawn below vocab size {c.vocab_size} (--vocab-size), rows are up to max length "
                     f"{c.max_length} (--max-length) long: does the model take both?]")
        elif _call_mismatch(err):  # called with too many or too few inputs
            call = "model(src, tgt)" if c.kind == "seq2seq" else "model(ids)"
            what += f" [{'an' if c.kind == 'encoder' else 'a'} {c.kind} is called as {call}: is --kind right?]"
        return _stopped(name, mut, what, {"exception": f"{type(err).__name__}: {err}"})
    except OutputError as err:  # attnlab's own check of the output: the model raised nothing
        return _stopped(name, mut, str(err), {"output_error": str(err)})
    except Exception as err:  # anything else is the check's own trouble; a report beats a traceback
        return _stopped(name, mut, f"the check stopped on {in_one_line(err)}", {"check_error": in_one_line(err)})


def _rounding_noted(result: CheckResult, mut: ModelUnderTest) -> CheckResult:
    """``result``, a failed comparison of a half-precision output that differed by no more than the dtype's
    rounding, told that rounding alone may be the cause: a correct bfloat16 model failed padding-invariance by
    0.0156, blamed on its masks. A larger difference, or a failure that is no difference (outputs too alike, or
    a layout), gets no such note, nor do the checks of :data:`KERNEL_COMPARING`, whose bound allows for rounding
    already (the others compare one kernel on varied inputs and keep theirs)."""
    half = mut.output_dtype in (torch.bfloat16, torch.float16)
    if not (half and result.failed and result.name in COMPARING and result.name not in KERNEL_COMPARING):
        return result
    diff, bound = result.evidence.get("max_diff"), result.evidence.get("bound")
    if not isinstance(diff, float) or not isinstance(bound, float) or not diff > bound:
        return result
    scale = (bound - TOLERANCE.atol) / TOLERANCE.rtol  # the output's scale the bound was made from
    if diff > EPS_FACTOR * torch.finfo(mut.output_dtype).eps * scale:  # larger than rounding: a bug to look for
        return result
    dtype = str(mut.output_dtype).removeprefix("torch.")
    return replace(result, summary=f"{result.summary}; note: the output is {dtype}, whose rounding alone can pass "
                                   "this bound: check the model in float32 to tell a bug from rounding")


def _refuse_uncallable(mut: ModelUnderTest) -> None:
    """Call the model on two plain batches (the output layout is decided there) and raise :class:`AttnlabError`
    when it cannot be called as its kind says (Python's own complaint about the arguments) or returns what no
    check can use: that is the command's usage, one line, not a finding to repeat in every check. A model that
    raises anything else is left to the checks, which report it with the input that made it raise."""
    c = mut.contract
    try:
        with mode(mut.model, training=False):
            mut.per_position  # noqa: B018 (the property calls the model)
    except ModelRaised as raised:
        err = raised.error
        if _call_mismatch(err):
            call = "model(src, tgt)" if c.kind == "seq2seq" else "model(ids)"
            # A keyword-only mask the model requires (attnlab's own convention) is no wrong --kind: the checks
            # pass ids alone, and the masks are the model's to build from them.
            advice = ("the checks pass ids alone: give a factory whose model builds its masks from the ids (a "
                      "wrapper that calls this one with them)") if "keyword-only" in str(err) else "is --kind right?"
            raise AttnlabError(f"the model cannot be called as {'an' if c.kind == 'encoder' else 'a'} {c.kind} is, "
                               f"{call}: {in_one_line(err)}; {advice}") from err
    except OutputError as err:
        raise AttnlabError(f"the checks cannot use the model's output: {err} ({mut.input_summary()})") from err


def _call_mismatch(err: BaseException) -> bool:
    """Whether ``err`` is Python refusing the call's arguments at the model's door, not a TypeError from inside
    it: the message says so, and below the checks' own call every frame passes the call on as it came
    (:func:`_passes_on`: ``Module.__call__``, ``DataParallel``, ``torch.compile``'s module, a ``no_grad`` or
    ``autocast`` decorator), or there is none. A submodule called with the wrong arguments inside the model (a
    mask passed positionally to an ``nn.Sequential``; a ``TransformerDecoderLayer`` in a ``Sequential``, given no
    memory) is the model's own bug: its frames, or torch's layers' (``torch/nn/modules/``), lie between."""
    if not (isinstance(err, TypeError) and _WRONG_ARITY.search(str(err))):
        return False
    codes = []
    tb = err.__traceback__
    while tb is not None:
        codes.append(tb.tb_frame.f_code)
        tb = tb.tb_next
    while codes and _passes_on(codes[-1]):
        codes.pop()
    call = ModelUnderTest.__call__.__code__  # the model is called from lambdas defined in it
    return bool(codes) and (codes[-1] is call or codes[-1] in call.co_consts)


_TORCH = Path(torch.__file__).resolve().parent


def _passes_on(code: CodeType) -> bool:
    """Whether ``code`` passes a call on to the model with its arguments as they came: torch's own, but for its
    layers (``torch/nn/modules/``: a ``Sequential`` calls its layers with arguments of its own), whose
    ``Module.__call__`` alone passes the call on."""
    path = Path(code.co_filename).resolve()
    if not path.is_relative_to(_TORCH):
        return False
    inside = path.relative_to(_TORCH).parts
    return inside[:2] != ("nn", "modules") or inside[2:] == ("module.py",)


def _stopped(name: str, mut: ModelUnderTest, what: str, evidence: dict[str, Any]) -> CheckResult:
    """A failed check that stopped on ``what``, with the seed and the latest input as its evidence."""
    where = [f"seed {mut.seed}"] if mut.seed is not None else []
    if mut.last_input:  # with no seed yet, the input was the fixed one that finds out the output layout
        probe = "" if mut.seed is not None else ", the output-layout probe, the same for every seed"
        where += [mut.input_summary() + probe]
    summary = what + (f" ({'; '.join(where)})" if where else "")
    return CheckResult(name, "fail", summary, "", 0, {**evidence, "seed": mut.seed, "input": mut.last_input})


@contextmanager
def _buffers_kept(model: Any) -> Iterator[None]:
    """Give an ``nn.Module`` its buffers back as they were: calls in train mode update some (batch norm's running
    statistics), and checking a trained model must not change what it computes afterwards."""
    buffers = list(model.buffers()) if isinstance(model, nn.Module) else []
    saved = [b.detach().clone() for b in buffers]
    try:
        yield
    finally:
        for buffer, value in zip(buffers, saved):
            # (a buffer made under inference_mode can only be written in it)
            with torch.inference_mode() if buffer.is_inference() else torch.no_grad():
                buffer.copy_(value)


def run_checks(
    model: Callable[..., Any],
    contract: Contract,
    *,
    seeds: int | Iterable[int] = 5,
    only: Iterable[str] | None = None,
    spec: str = "",
) -> CheckReport:
    """Run the checks on ``model``.

    Args:
        model: ``model(ids)`` for encoders and decoders, ``model(src, tgt)`` for seq2seq; ids are
            (batch, seq) LongTensors. An ``nn.Module`` is put in eval mode for the checks (and in train
            mode for part of ``mode`` and ``causal``), and its own mode and its buffers (batch norm's running
            statistics, which train-mode calls update) are restored afterwards.
        contract: the inputs it accepts.
        seeds: how many seeds (``range(seeds)``) or which ones; every check runs on each.
        only: names of the checks to run, or one name (default all, see :data:`CHECKS`).
        spec: where the model came from, for the report.

    While it runs, torch's process-wide MultiheadAttention fast-path flag is switched (and restored after
    every call): calls in other threads meanwhile may take the other path. Runs in two threads take turns.
    """
    if not isinstance(contract, Contract):  # run_checks(model, "decoder") would fail every check obscurely
        raise TypeError(f"contract must be an attnlab.checks.Contract, e.g. Contract('decoder'), got {contract!r}")
    if not callable(model):
        raise TypeError(f"model must be callable (an nn.Module or a function of ids), got {type(model).__name__}")
    # (a bare name is one check, not its letters; an empty selection would pass a report of no checks)
    names = list(CHECKS) if only is None else [only] if isinstance(only, str) else list(only)
    if not names:
        raise AttnlabError(f"only names no check; leave it out for all of them, or name some of {', '.join(CHECKS)}")
    seed_values = seed_list(seeds)
    mut = ModelUnderTest(model, contract)
    with FAST_PATH_LOCK, _buffers_kept(model):  # the checks switch torch's process-wide fast-path flag: one at a time
        _refuse_uncallable(mut)
        random = eval_randomness(mut, seed_values[0]) if set(names) & set(COMPARING) else None
        results = []
        for name in names:
            if random is not None and name in COMPARING:
                # Skipped when mode runs too and fails for the cause; failed when it is left out, so the exit
                # status still says that something is wrong.
                results.append(CheckResult(name, "skip" if "mode" in names else "fail", random, "", 0))
            else:
                results.append(run_check(name, mut, seed_values))
    return CheckReport(contract, seed_values, results, per_position=mut.detected_per_position, spec=spec)
