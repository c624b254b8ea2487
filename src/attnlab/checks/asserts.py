"""The checks as plain assertions for a user's own pytest suite.

>>> from attnlab.checks import assert_causal
>>> assert_causal(my_decoder, kind="decoder", vocab_size=100, max_length=32)   # doctest: +SKIP

Each function runs one check (or all of them) and raises ``AssertionError`` with the evidence (seed,
input, positions, size of the difference, or the exception the model raised) when it fails. It returns
the :class:`~attnlab.checks.result.CheckResult` otherwise, so a test can look at a ``note`` or ``skip``.
A model that cannot be called as its ``kind`` says, or whose output the checks cannot use, is refused first
with an :class:`~attnlab.errors.AttnlabError` naming the problem, as ``attnlab check`` refuses it (exit 2):
that is a wrong test, not a failed check.
Keyword arguments are those of :class:`~attnlab.checks.contract.Contract`, plus ``seeds``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from attnlab.checks.contract import Contract, Kind
from attnlab.checks.result import CheckResult
from attnlab.checks.runner import run_checks


def _assert_check(name: str, model: Callable[..., Any], kind: Kind, seeds: int | Iterable[int],
                  contract: dict[str, Any]) -> CheckResult:
    # through run_checks: its gate on eval-mode randomness (noise named as such, not blamed on a mask) and its
    # refusal of a model that cannot be called as the contract says
    result = run_checks(model, Contract(kind, **contract), seeds=seeds, only=[name]).results[0]
    if result.failed:
        raise AssertionError(result.describe())
    return result


def assert_causal(model: Callable[..., Any], *, kind: Kind = "decoder", seeds: int | Iterable[int] = 5,
                  **contract: Any) -> CheckResult:
    """Changing tokens after position t never changes outputs at positions <= t."""
    return _assert_check("causal", model, kind, seeds, contract)


def assert_padding_invariant(model: Callable[..., Any], *, kind: Kind, seeds: int | Iterable[int] = 5,
                             **contract: Any) -> CheckResult:
    """A row alone and the same row padded inside a batch give the same real outputs."""
    return _assert_check("padding-invariance", model, kind, seeds, contract)


def assert_padding_content_ignored(model: Callable[..., Any], *, kind: Kind, seeds: int | Iterable[int] = 5,
                                   **contract: Any) -> CheckResult:
    """More padding, or other ids under causal padding, changes nothing real."""
    return _assert_check("padding-content", model, kind, seeds, contract)


def assert_batch_independent(model: Callable[..., Any], *, kind: Kind, seeds: int | Iterable[int] = 5,
                             **contract: Any) -> CheckResult:
    """A row's output does not depend on the other rows of its batch."""
    return _assert_check("batch-independence", model, kind, seeds, contract)


def assert_order_sensitive(model: Callable[..., Any], *, kind: Kind, seeds: int | Iterable[int] = 5,
                           **contract: Any) -> CheckResult:
    """Reordering the real tokens changes the output (the model sees positions)."""
    return _assert_check("order-sensitivity", model, kind, seeds, contract)


def assert_finite(model: Callable[..., Any], *, kind: Kind, seeds: int | Iterable[int] = 5,
                  **contract: Any) -> CheckResult:
    """Full, padded, all-padding and longest rows give finite outputs."""
    return _assert_check("finite-outputs", model, kind, seeds, contract)


def assert_mode(model: Callable[..., Any], *, kind: Kind, seeds: int | Iterable[int] = 5,
                **contract: Any) -> CheckResult:
    """Eval mode is deterministic (train mode without dropout is a note, not a failure)."""
    return _assert_check("mode", model, kind, seeds, contract)


def assert_inference_path(model: Callable[..., Any], *, kind: Kind, seeds: int | Iterable[int] = 5,
                          **contract: Any) -> CheckResult:
    """Outputs on torch's inference fast path equal those of the path training takes."""
    return _assert_check("inference-path", model, kind, seeds, contract)


def assert_kv_cache(model: Callable[..., Any], *, kind: Kind = "decoder", seeds: int | Iterable[int] = 5,
                    **contract: Any) -> CheckResult:
    """Decoding with the model's key/value cache gives the outputs of the full forward pass."""
    return _assert_check("kv-cache", model, kind, seeds, contract)


def assert_all_checks(model: Callable[..., Any], *, kind: Kind, seeds: int | Iterable[int] = 5,
                      **contract: Any) -> list[CheckResult]:
    """Every check; the message lists each failure with its evidence."""
    report = run_checks(model, Contract(kind, **contract), seeds=seeds)
    failures = [r for r in report.results if r.failed]
    if failures:
        raise AssertionError(f"{len(failures)} check(s) failed:\n" + "\n".join(r.describe() for r in failures))
    return report.results
