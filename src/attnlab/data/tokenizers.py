"""Tokenizers: word-level (seed 004's ``Vocab``), character-level (nanoGPT), and subword BPE.

All three share one small interface: ``encode(text) -> list[int]``, ``decode(ids) -> str``,
``vocab_size``, ``pad_id`` (always 0), ``save(path)`` and :func:`load_tokenizer`. The subword tokenizer
is Hugging Face ``tokenizers`` (trained on the training texts only); the word and character vocabularies
are small enough to be plain JSON.

Special ids are fixed so that every model can rely on them: ``<pad>`` = 0 (masked everywhere),
``<unk>`` = 1, and for BPE ``<bos>`` = 2 and ``<eos>`` = 3.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from attnlab.errors import AttnlabError
from attnlab.files import decode_utf8, write_text_atomic

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
SPECIALS = (PAD, UNK, BOS, EOS)
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3

# Words (letters/digits, with inner apostrophes) and single punctuation marks, lower-cased: seed 004's rule.
_WORD_RE = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*|[^\sa-z0-9]")


class Tokenizer(Protocol):
    """What every tokenizer offers."""

    kind: str
    pad_id: int
    #: ids that stand for no text (padding, unknown, sequence marks): never a language model's training target.
    special_ids: tuple[int, ...]

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def save(self, path: str | Path) -> None: ...


def word_tokens(text: str) -> list[str]:
    """Lower-case words and punctuation marks of ``text``."""
    return _WORD_RE.findall(text.lower())


class WordTokenizer:
    """A word vocabulary counted on training texts; id 0 pads, id 1 stands for unknown words.

    Args:
        itos: the words in id order, specials first.
    """

    kind = "word"
    pad_id = PAD_ID
    special_ids = (PAD_ID, UNK_ID)

    def __init__(self, itos: list[str]) -> None:
        self.itos = itos
        self.stoi = {w: i for i, w in enumerate(itos)}

    @classmethod
    def train(cls, texts: Iterable[str], min_freq: int = 1, max_size: int | None = None) -> WordTokenizer:
        """Count words; keep those seen ``min_freq`` times, most frequent first (ties: first seen)."""
        counts = Counter(w for text in texts for w in word_tokens(text))
        words = [w for w, c in counts.most_common(max_size) if c >= min_freq]
        return cls([PAD, UNK, *words])

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        return [self.stoi.get(w, UNK_ID) for w in word_tokens(text)]

    def decode(self, ids: Iterable[int]) -> str:
        return " ".join(self.itos[i] for i in ids if i != PAD_ID)

    def to_json(self) -> dict:
        return {"kind": self.kind, "itos": self.itos}

    def save(self, path: str | Path) -> None:
        write_text_atomic(path, json.dumps(self.to_json(), ensure_ascii=False))


class CharTokenizer:
    """One id per character seen in the training text (nanoGPT's character-level Shakespeare).

    Id 0 is reserved for padding; characters get ids from 1 in sorted order. A character the
    vocabulary has never seen is an error that names it: a character model cannot represent it.
    """

    kind = "char"
    pad_id = PAD_ID
    special_ids = (PAD_ID,)

    def __init__(self, chars: list[str]) -> None:
        self.chars = chars
        self.stoi = {c: i + 1 for i, c in enumerate(chars)}

    @classmethod
    def train(cls, text: str) -> CharTokenizer:
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars) + 1

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[c] for c in text]
        except KeyError as err:
            raise AttnlabError(
                f"character {err.args[0]!r} is not in this model's vocabulary of {len(self.chars)} characters"
            ) from None

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.chars[i - 1] for i in ids if 0 < i <= len(self.chars))

    def to_json(self) -> dict:
        return {"kind": self.kind, "chars": self.chars}

    def save(self, path: str | Path) -> None:
        write_text_atomic(path, json.dumps(self.to_json(), ensure_ascii=False))


class BPETokenizer:
    """Byte-pair-encoding subwords from Hugging Face ``tokenizers``.

    Text is split on spaces with the SentencePiece-style ``Metaspace`` marker, so decoding puts the
    spaces back exactly (what sacreBLEU's detokenized scoring needs). Cased; NFKC-normalised; trained for
    sentences, runs of whitespace read as one space (see :meth:`train`).
    """

    kind = "bpe"
    pad_id = PAD_ID
    special_ids = (PAD_ID, UNK_ID, BOS_ID, EOS_ID)

    def __init__(self, tokenizer) -> None:  # a tokenizers.Tokenizer
        self.hf = _literal_specials(tokenizer)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 8000, min_frequency: int = 2, *,
              collapse_whitespace: bool = True) -> BPETokenizer:
        """Learn the merges from ``texts``.

        ``collapse_whitespace``: a tab, a line break, a double or a Unicode space reads as one space, and spaces at
        the ends go, as SentencePiece does: otherwise a tab became ``<unk>`` and a trailing space a piece of its
        own, so an invisible difference changed a translation. Off for running text whose line breaks are content
        (the language model). Saved with the tokenizer, so a run reads its texts the way it was trained.
        """
        from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE(unk_token=UNK))
        tok.normalizer = normalizers.Sequence(
            [normalizers.NFKC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip()]
        ) if collapse_whitespace else normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[PAD, UNK, BOS, EOS],
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        if tok.get_vocab_size() > vocab_size:
            # The trainer keeps every character it saw whatever the size asked for, so a smaller request would
            # silently come back larger (and without a single merge).
            need = tok.get_vocab_size()
            raise AttnlabError(
                f"a BPE vocabulary of {vocab_size} ids cannot hold the {need} it starts from: the training text's "
                f"{need - 4} distinct symbols (the word-start mark among them) and 4 special tokens; ask for at least "
                f"{need}")
        return cls(tok)

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Many texts at once (the Rust side runs them in parallel)."""
        return [e.ids for e in self.hf.encode_batch(texts)]

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text without padding, bos and eos; an unknown piece stays visible as ``<unk>``.

        (``skip_special_tokens=True`` would drop ``<unk>`` too, and "Zebra" with an unseen "Z" and "b" would
        come back as the real-looking word "era".)"""
        return self.hf.decode([i for i in ids if i not in (PAD_ID, BOS_ID, EOS_ID)], skip_special_tokens=False)

    def save(self, path: str | Path) -> None:
        write_text_atomic(path, self.hf.to_str())


def _literal_specials(tokenizer):
    """``tokenizer``, made to read "<pad>" or "<eos>" in a text as the characters they are.

    By default ``tokenizers`` turns such a string into the special id, so a sentence that quotes "<pad>" would be
    masked as padding there and an "<eos>" inside a target would teach the model to stop mid-sentence; the
    special ids come from the code (padding, bos and eos added by id), never from the text. The setting is not
    saved in the tokenizer's file, hence set on every tokenizer made or read. A merge the trainer learned from
    such a text (``<pad`` + ``>``) would still give the special id, since its result has that id in the
    vocabulary: those merges go (a trained tokenizer is rebuilt without them, a loaded one too)."""
    from tokenizers import Tokenizer

    if type(tokenizer.model).__name__ == "BPE":
        data = json.loads(tokenizer.to_str())
        merges = data["model"]["merges"]
        kept = [m for m in merges if "".join(m if isinstance(m, list) else m.split(" ")) not in SPECIALS]
        if len(kept) != len(merges):
            data["model"]["merges"] = kept
            tokenizer = Tokenizer.from_str(json.dumps(data))
    tokenizer.encode_special_tokens = True
    return tokenizer


def load_tokenizer(path: str | Path, vocab_size: int | None = None) -> WordTokenizer | CharTokenizer | BPETokenizer:
    """Read a tokenizer saved by any of the classes above.

    ``vocab_size``: the model's vocabulary, which the tokenizer must match: a run folder that mixes files of
    two runs would otherwise decode ids to the wrong text (or fail on ids past the end of the table).
    """
    tokenizer = _read_tokenizer(Path(path))
    if vocab_size is not None and tokenizer.vocab_size != vocab_size:
        raise AttnlabError(f"{path} has {tokenizer.vocab_size} ids but the model {vocab_size}; the run folder mixes "
                           "files of different runs")
    return tokenizer


def _strings(data: dict, key: str, *, characters: bool = False) -> list[str]:
    """``data[key]``, which must be a list of distinct non-empty strings (the words or, with ``characters``, the
    single characters of a vocabulary, in id order). An entry twice would give one text two ids, and an empty or
    longer one would drop or add text: a damaged file would decode without a word, wrongly."""
    value = data[key]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise TypeError(f"{key!r} must be a list of strings")
    wrong = next((item for item in value if (len(item) != 1 if characters else not item)), None)
    if wrong is not None:
        raise ValueError(f"{key!r} holds {wrong!r}, which is not {'one character' if characters else 'a word'}")
    seen: set[str] = set()
    for item in value:
        if item in seen:
            raise ValueError(f"{key!r} holds {item!r} twice")
        seen.add(item)
    return value


def _read_tokenizer(path: Path) -> WordTokenizer | CharTokenizer | BPETokenizer:
    if not path.is_file():
        raise AttnlabError(f"no tokenizer file {path}")
    text = decode_utf8(path.read_bytes(), path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise AttnlabError(f"{path} is not a tokenizer file: {err}") from err
    kind = data.get("kind") if isinstance(data, dict) else None
    try:
        if kind == "word":
            return WordTokenizer(_strings(data, "itos"))
        if kind == "char":
            return CharTokenizer(_strings(data, "chars", characters=True))
        if isinstance(data, dict) and "model" in data:
            from tokenizers import Tokenizer

            return BPETokenizer(Tokenizer.from_str(text))
    except AttnlabError:
        raise
    except Exception as err:  # a key missing, a list of the wrong things, or what the tokenizers library refuses
        # (it raises a bare Exception); the file's kind is known, its content is broken
        missing = f"no {err}" if isinstance(err, KeyError) else str(err)
        raise AttnlabError(f"{path} is a broken tokenizer file ({missing})") from None
    raise AttnlabError(f"{path} is not a tokenizer file attnlab knows")
