"""Behavioural checks that catch the silent transformer bugs, on any model.

The checks treat a model as a black box: ``model(ids)`` for an encoder or a decoder, ``model(src, tgt)``
for a seq2seq model, with (batch, seq) LongTensor ids; the output is per position, (batch, seq, ...),
or pooled, (batch, ...), detected from its shape. They vary the inputs and compare the outputs:

=====================  =======================================================  ===========================
check                  what must hold                                           catches (seeds)
=====================  =======================================================  ===========================
``causal``             later tokens never change earlier outputs                dropped look-ahead mask (000)
``padding-invariance`` a row alone = the same row padded in a batch             no padding mask (004)
``padding-content``    more padding / ids under causal padding change nothing   masks built, not applied
``batch-independence`` a row ignores its neighbours                             (B,1,S)+(B,S) mask (000)
``order-sensitivity``  reordering tokens changes the output                     no positions (000, 004)
``finite-outputs``     full, padded, empty and longest rows are finite          inverted padding mask (004)
``mode``               eval deterministic; train differs if dropout             dropout at eval (000)
``inference-path``     torch's inference fast path = the training path          float 0/1 mask torch adds
``kv-cache``           cached decoding = the full forward pass                  positions restarting at 0
=====================  =======================================================  ===========================

The model is called with torch's inference fast path switched off, so that it computes what training
computes: the fast path reads masks differently and can hide a leak (see :mod:`attnlab.checks.inference`).

Outputs agree within :data:`~attnlab.checks.compare.TOLERANCE` (each entry within ``1e-5 + 1e-4 x``
its feature's largest magnitude; for ``inference-path`` at least four machine epsilons
of a half-precision output, relative); entries non-finite alike on both sides are left out, a comparison with
one non-finite on one side only decides nothing, and a check left with none skips.

Entry points: :func:`run_checks` (a :class:`CheckReport`), the ``assert_*`` functions for pytest, and the
``attnlab check SPEC --kind KIND`` command. Hugging Face models, which take keywords and an ``attention_mask``,
go in :class:`HFAdapter` (encoders, decoders: ``model(ids)``) or :class:`HFSeq2SeqAdapter` (encoder-decoders:
``model(src, tgt)``); an encoder-decoder passed bare is refused, since positionally its target would be read as
its attention mask.
"""

from attnlab.checks.adapters import HFAdapter, HFSeq2SeqAdapter, PadIdWarning
from attnlab.checks.asserts import (
    assert_all_checks,
    assert_batch_independent,
    assert_causal,
    assert_finite,
    assert_inference_path,
    assert_kv_cache,
    assert_mode,
    assert_order_sensitive,
    assert_padding_content_ignored,
    assert_padding_invariant,
)
from attnlab.checks.calling import output_tensor
from attnlab.checks.compare import TOLERANCE, Tolerance
from attnlab.checks.contract import KINDS, Contract
from attnlab.checks.loading import load_factory, load_model
from attnlab.checks.report import CheckReport
from attnlab.checks.result import CheckResult
from attnlab.checks.runner import CHECKS, run_check, run_checks

__all__ = [
    "HFAdapter", "HFSeq2SeqAdapter", "PadIdWarning",
    "assert_all_checks", "assert_batch_independent", "assert_causal", "assert_finite", "assert_inference_path", "assert_kv_cache", "assert_mode",
    "assert_order_sensitive", "assert_padding_content_ignored", "assert_padding_invariant",
    "output_tensor", "TOLERANCE", "Tolerance", "KINDS", "Contract", "load_factory", "load_model",
    "CheckReport", "CheckResult", "CHECKS", "run_check", "run_checks",
]
