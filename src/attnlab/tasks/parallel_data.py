"""Parallel text for translation: line-aligned file pairs, their checks, ids, and token-count batches.

A corpus is named by a *prefix*: ``PREFIX.de`` and ``PREFIX.en`` (each optionally ``.gz``) hold one
sentence a line, line ``i`` of one file translating line ``i`` of the other. Files that do not line up
(different line counts) and empty lines are :class:`~attnlab.errors.AttnlabError` messages that name
the files and the line numbers: a silently shifted corpus trains a model on wrong pairs.

**Ids.** The source is ``tokens + [eos]`` (the end marker tells the encoder where the sentence stops);
the target is split in two, shifted by one position, so that position ``t`` predicts token ``t + 1``::

    decoder input   [bos] y1 y2 ... yn
    decoder output  y1    y2 ... yn [eos]

**Length rule** (documented in ``attnlab train translate --help`` and the README):

* a source longer than the model's source position table is **truncated** to fit (its last slot keeps
  the ``eos``), with one warning that counts the truncated lines; this applies to training, evaluation
  and translation alike, so a long input is never an index error deep inside the model;
* a training or validation pair whose target does not fit the target position table is **left out**
  of training (one warning with the count): a cut target would teach the model to stop mid-sentence.
  Evaluation references are never cut; BLEU sees them whole.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from attnlab.data import BOS_ID, EOS_ID, PAD_ID, bucketed_batches, pad_batch
from attnlab.errors import AttnlabError
from attnlab.files import fingerprint, read_lines

#: Most line numbers one message lists before it says "and N more".
MAX_LISTED = 5


class LengthWarning(UserWarning):
    """Some lines were truncated or left out by the length rule."""


def side_path(prefix: str | Path, lang: str) -> Path:
    """``PREFIX.lang``, or ``PREFIX.lang.gz`` when only that exists."""
    plain = Path(f"{prefix}.{lang}")
    zipped = Path(f"{prefix}.{lang}.gz")
    if plain.is_file():
        return plain
    if zipped.is_file():
        return zipped
    folders = [str(path) for path in (plain, zipped) if path.is_dir()]  # ("no file" would send one looking for it)
    if folders:
        raise AttnlabError(f"{' and '.join(folders)} {'is a folder' if len(folders) == 1 else 'are folders'}, not "
                           f"a text file (a corpus prefix names PREFIX.{lang}, optionally .gz)")
    raise AttnlabError(f"no file {plain} or {zipped} (a corpus prefix names PREFIX.{lang}, optionally .gz)")


def file_record(path: Path) -> dict[str, str]:
    """What a run keeps of one corpus file it read: the absolute path (a resume from another folder finds it), the
    SHA-256 of its bytes, and that of the lines read from it (:func:`lines_fingerprint`)."""
    return {"path": str(path.resolve()), "sha256": fingerprint(path), "lines_sha256": lines_fingerprint(path)}


def lines_fingerprint(path: Path) -> str:
    """SHA-256 of the lines :func:`~attnlab.files.read_lines` reads from ``path``: the same for the file gunzipped or
    gzipped again, or with CRLF line ends, which are all the same data to a run."""
    return hashlib.sha256("\n".join(read_lines(path)).encode("utf-8")).hexdigest()


def holds_recorded_data(now: Path, record: dict[str, str]) -> bool:
    """Whether ``now``, the file a corpus prefix names today, holds the lines a run read from the file ``record``
    describes (:func:`file_record`), whatever their packing: plain or gzipped, LF or CRLF."""
    if fingerprint(now) == record["sha256"]:
        return True
    if "lines_sha256" in record:
        return lines_fingerprint(now) == record["lines_sha256"]
    # A run from before the line digests: PREFIX.lang unzipped beside the PREFIX.lang.gz it read, that .gz
    # unchanged and holding the same lines.
    zipped = now.with_name(now.name + ".gz")
    return (record["path"].endswith(".gz") and not now.name.endswith(".gz") and zipped.is_file()
            and fingerprint(zipped) == record["sha256"] and read_lines(zipped) == read_lines(now))


def _listed(numbers: Sequence[int]) -> str:
    shown = ", ".join(str(n) for n in numbers[:MAX_LISTED])
    more = len(numbers) - MAX_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


def check_nonempty(lines: Sequence[str], path: str | Path) -> None:
    """Raise naming the (1-based) line numbers of empty or blank lines."""
    empty = [i + 1 for i, line in enumerate(lines) if not line.strip()]
    if empty:
        raise AttnlabError(
            f"{path}: empty line{'s' if len(empty) > 1 else ''} {_listed(empty)} "
            f"({len(empty)} in all); every line must hold one sentence"
        )


def check_aligned(src: Sequence[str], tgt: Sequence[str], src_path: str | Path, tgt_path: str | Path) -> None:
    """Raise unless both sides have the same number of lines, at least one; name the first line only one side has."""
    if not src and not tgt:
        raise AttnlabError(f"{src_path} and {tgt_path} hold no sentences")
    if len(src) != len(tgt):
        shorter = min(len(src), len(tgt))
        raise AttnlabError(
            f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}; parallel files must be "
            f"line-aligned (line {shorter + 1} exists on one side only)"
        )


def read_parallel(prefix: str | Path, src_lang: str, tgt_lang: str) -> tuple[list[str], list[str]]:
    """Read, align-check and empty-check ``PREFIX.src`` and ``PREFIX.tgt``; return both sides."""
    if src_lang == tgt_lang:
        raise AttnlabError(f"source and target language are both {src_lang!r}")
    src_path, tgt_path = side_path(prefix, src_lang), side_path(prefix, tgt_lang)
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    check_aligned(src, tgt, src_path, tgt_path)
    if not src:
        raise AttnlabError(f"{src_path} and {tgt_path} are empty")
    check_nonempty(src, src_path)
    check_nonempty(tgt, tgt_path)
    return src, tgt


def source_ids(pieces: Sequence[Sequence[int]], max_positions: int, what: str = "source") -> list[list[int]]:
    """Token ids -> encoder inputs ``tokens + [eos]``, truncated to ``max_positions`` (the length rule).

    Warns once (:class:`LengthWarning`) with the number of truncated lines.
    """
    out, cut = [], 0
    for ids in pieces:
        if len(ids) + 1 > max_positions:
            ids, cut = ids[: max_positions - 1], cut + 1
        out.append([*ids, EOS_ID])
    if cut:
        warnings.warn(
            f"{cut} {what} line{'s' if cut > 1 else ''} longer than the model's {max_positions} source "
            f"positions {'were' if cut > 1 else 'was'} truncated to fit",
            LengthWarning, stacklevel=2,
        )
    return out


@dataclass
class Pairs:
    """Encoded sentence pairs.

    Attributes:
        src: per pair ``tokens + [eos]``.
        tgt: per pair the target tokens, without bos/eos (added when batching).
        kept: the line index (0-based) each pair came from.
    """

    src: list[list[int]]
    tgt: list[list[int]]
    kept: list[int]

    def __len__(self) -> int:
        return len(self.src)

    def lengths(self) -> list[int]:
        """Per pair the longer of the two padded sides (source with eos, target with bos or eos)."""
        return [max(len(s), len(t) + 1) for s, t in zip(self.src, self.tgt)]


def _fitting_targets(tgt_pieces: Sequence[Sequence[int]], max_tgt: int, what: str) -> list[int]:
    """The indices of the pairs whose target fits ``max_tgt`` positions; one warning counts the others."""
    fits = [i for i, t in enumerate(tgt_pieces) if len(t) + 1 <= max_tgt]
    dropped = len(tgt_pieces) - len(fits)
    if dropped:
        warnings.warn(
            f"{dropped} {what} pair{'s' if dropped > 1 else ''} whose target is longer than the model's "
            f"{max_tgt} target positions {'were' if dropped > 1 else 'was'} left out",
            LengthWarning, stacklevel=3,
        )
    if not fits:
        raise AttnlabError(f"no {what} pair fits the model's {max_tgt} target positions")
    return fits


def encode_pairs(
    src_pieces: Sequence[Sequence[int]], tgt_pieces: Sequence[Sequence[int]], max_src: int, max_tgt: int, what: str
) -> Pairs:
    """Apply the length rule to tokenized pairs: truncate long sources, leave out long targets."""
    fits = _fitting_targets(tgt_pieces, max_tgt, what)
    src = source_ids([src_pieces[i] for i in fits], max_src, what=f"{what} source")
    return Pairs(src=src, tgt=[list(tgt_pieces[i]) for i in fits], kept=fits)


def pair_sources(sources: Sequence[list[int]], tgt_pieces: Sequence[Sequence[int]], max_tgt: int, what: str) -> Pairs:
    """Pairs of encoder inputs made already by :func:`source_ids` (for translating every line too) and their
    targets, long targets left out: the sources are truncated, and their truncation warned about, once."""
    fits = _fitting_targets(tgt_pieces, max_tgt, what)
    return Pairs(src=[sources[i] for i in fits], tgt=[list(tgt_pieces[i]) for i in fits], kept=fits)


def collate(pairs: Pairs, index: Sequence[int]) -> dict[str, Tensor]:
    """Pairs ``index`` as padded tensors.

    Returns:
        ``src`` (batch, src_len), ``tgt_in`` (batch, tgt_len) = bos + tokens, ``tgt_out`` (batch, tgt_len)
        = tokens + eos; all long, right-padded with ``PAD_ID``.
    """
    return {
        "src": pad_batch([pairs.src[i] for i in index], PAD_ID),
        "tgt_in": pad_batch([[BOS_ID, *pairs.tgt[i]] for i in index], PAD_ID),
        "tgt_out": pad_batch([[*pairs.tgt[i], EOS_ID] for i in index], PAD_ID),
    }


def token_batches(pairs: Pairs, *, max_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """Pair indices in batches of at most ``max_tokens`` padded positions per side, length-bucketed."""
    return bucketed_batches(pairs.lengths(), max_tokens=max_tokens, seed=seed, epoch=epoch)


def sorted_chunks(lengths: Sequence[int], max_tokens: int, max_rows: int = 512) -> Iterator[list[int]]:
    """Indices sorted by length, cut into chunks of at most ``max_tokens`` padded positions (for decoding).

    Decoding wants no randomness, only little padding; the caller puts the results back in order.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    chunk: list[int] = []
    for i in order:
        if chunk and ((len(chunk) + 1) * lengths[i] > max_tokens or len(chunk) >= max_rows):
            yield chunk
            chunk = []
        chunk.append(i)
    if chunk:
        yield chunk


def real_tokens(ids: Tensor) -> int:
    """Number of non-padding ids in a tensor."""
    return int((ids != PAD_ID).sum())

