"""Section 3: positional encoding meets real word embeddings (GloVe).

Seed 000's experiment, step by step: two engineered sentences holding the same eleven words in two
orders; an explicit vocabulary (index from 1, 0 kept for padding); post-padding to the maximum length;
a (vocab + 1, d) embedding matrix from GloVe; PCA layouts with and without the encoding; the red/wolf
distances; the weightings W1 * embedding + W2 * encoding; and the Procrustes disparity of each weighted
layout from the semantic-only one.

Computed in float64 so that the measured distances and disparities do not depend on float32 rounding.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
from scipy.spatial import procrustes
from sklearn.decomposition import PCA

from attnlab.data.batching import pad_batch
from attnlab.data.glove import WordVectors
from attnlab.errors import AttnlabError
from attnlab.lab import figures
from attnlab.lab.encoding import SEED_GLOVE, SEED_WIDTH
from attnlab.lab.html import Section, check, code, esc, figure, fmt, heading, para, table
from attnlab.lab.sentences import GROUPS, SENTENCES
from attnlab.nn import sinusoidal_encoding

MAX_NB_WORDS = 64  # the seed's vocabulary cap; far above the 11 words used
PAD_ID = 0
#: (W1, W2) weightings of meaning and position, as the seed plots them; "sqrt_d:1" is added below.
WEIGHTINGS = ((1.0, 10.0, "1:10", "position dominates"), (1.0, 1.0, "1:1", "equal"),
              (10.0, 1.0, "10:1", "meaning dominates"))
PAIR = ("red", "wolf")
#: Seed 000's printed figures, from its 100-wide GloVe vectors (quoted beside this page's own).
SEED_RED_WOLF = {0: (5.599, 7.374), 1: (5.599, 5.674)}
SEED_DISPARITY = {"1:10": 0.990159, "1:1": 0.428852, "10:1": 0.000378}
KEPT_DISPARITY = 0.05  # below it the page calls a layout "almost unchanged" (the seed's 10:1 is 0.0004)


def build_vocabulary(texts: tuple[str, ...] = SENTENCES) -> tuple[dict[str, int], list[list[int]], dict[str, int]]:
    """Word index by frequency (ties by first appearance), numbered from 1 so that 0 means padding.

    Returns:
        word_index, the sentences as id lists, and the word counts.
    """
    counts = Counter(word for text in texts for word in text.split())
    # most_common keeps first-appearance order among equal counts, as Keras' Tokenizer did.
    word_index = {word: i + 1 for i, (word, _) in enumerate(counts.most_common(MAX_NB_WORDS))}
    sequences = [[word_index[w] for w in text.split()] for text in texts]
    return word_index, sequences, dict(counts)


def pad_post(sequences: list[list[int]], max_length: int) -> torch.Tensor:
    """Append ``PAD_ID`` to each sequence up to ``max_length``: (batch, max_length) long."""
    longest = max(len(s) for s in sequences)
    if max_length < longest:
        raise AttnlabError(f"--max-length {max_length} is shorter than the sentences ({longest} words)")
    return pad_batch(sequences, PAD_ID, length=max_length)


def embedding_matrix(word_index: dict[str, int], vectors: WordVectors) -> tuple[torch.Tensor, list[str]]:
    """(vocab + 1, d) float64 rows from GloVe, row 0 (padding) and missing words left at zero.

    Returns:
        the matrix and the words GloVe does not hold.
    """
    matrix = torch.zeros(len(word_index) + 1, vectors.dim, dtype=torch.float64)
    missing = []
    for word, i in word_index.items():
        vec = vectors.vectors.get(word)
        if vec is None:
            missing.append(word)
        else:
            matrix[i] = torch.from_numpy(np.asarray(vec, dtype=np.float64))
    return matrix, missing


def pca_layout(states: torch.Tensor) -> np.ndarray:
    """Two-component PCA of (n_words, d) vectors: (n_words, 2)."""
    # (vectors all alike have no variance: scikit-learn's share of it divides 0 by 0, a warning printed before the
    # page's own error line about such a layout; the layout itself is computed the same)
    with np.errstate(divide="ignore", invalid="ignore"):
        return PCA(n_components=2).fit_transform(states.numpy())


@dataclass
class _Experiment:
    words: list[list[str]]
    embedding: torch.Tensor  # (2, L, d)
    encoding: torch.Tensor  # (L, d)
    lengths: list[int]

    def weighted(self, w1: float, w2: float, sentence: int) -> torch.Tensor:
        """The real (unpadded) rows of W1 * embedding + W2 * encoding for one sentence: (n, d)."""
        n = self.lengths[sentence]
        return w1 * self.embedding[sentence, :n] + w2 * self.encoding[:n]

    def distance(self, w2: float, sentence: int, a: str, b: str) -> float:
        rows = self.weighted(1.0, w2, sentence)
        ia, ib = self.words[sentence].index(a), self.words[sentence].index(b)
        return float(torch.linalg.vector_norm(rows[ia] - rows[ib]))


def _shown(key: str) -> str:
    """A weighting key as the page shows it ("sqrt_d:1" -> "sqrt(d):1")."""
    return key.replace("sqrt_d", "sqrt(d)")


def matches_seed(red_wolf: dict[str, dict[str, float]]) -> bool:
    """Whether this page's red/wolf distances are seed 000's (to the seed's three decimals, and a little float
    rounding): the figures decide, not the file's name, whether the page computed with the seed's vectors."""
    return all(abs(red_wolf[f"sentence{s}"][key] - seed) <= 2e-3
               for s, figures in SEED_RED_WOLF.items() for key, seed in zip(("semantic", "with_position"), figures))


def _red_and_wolf(exp: _Experiment, words: list[list[str]],
                  vectors: WordVectors) -> tuple[str, dict[str, dict], bool, bool]:
    """The red/wolf distances in both sentences, without and with position: (html, figures, pattern holds, the
    figures are the seed's)."""
    d = vectors.dim
    red_wolf = {}
    rows = []
    for s in (0, 1):
        gap = abs(words[s].index(PAIR[0]) - words[s].index(PAIR[1]))
        sem, pos = exp.distance(0.0, s, *PAIR), exp.distance(1.0, s, *PAIR)
        red_wolf[f"sentence{s}"] = {"gap": gap, "semantic": sem, "with_position": pos}
        rows.append((f"sentence {s}", f"{gap} token{'s' if gap != 1 else ''}", fmt(sem, 3), fmt(pos, 3),
                     f"{SEED_RED_WOLF[s][0]:.3f} / {SEED_RED_WOLF[s][1]:.3f}"))
    body = heading("Red and wolf")
    body += para("Two unrelated words, three tokens apart in sentence 0 and adjacent in sentence 1:")
    body += table(["", "apart", f"distance, semantic only (d = {d})", f"distance, with position (d = {d})",
                   f"seed 000, d = {SEED_WIDTH}: semantic / with position"], rows)
    far, near = red_wolf["sentence0"], red_wolf["sentence1"]
    # "Adds more" must be an addition: with both distances shrinking, the smaller shrink passed before.
    pattern = (abs(far["semantic"] - near["semantic"]) < 1e-9 and far["with_position"] > far["semantic"]
               and far["with_position"] - far["semantic"] > near["with_position"] - near["semantic"])
    body += check(pattern, "the semantic distance is the same in both sentences, and position pushes the pair that "
                           "stands further apart beyond it, by more than the adjacent pair: that difference is the "
                           "order information")
    seeds_own = matches_seed(red_wolf)
    if not seeds_own:
        theirs = (f"{d}-wide ones" if d != SEED_WIDTH else
                  "ones, as wide but not the same although the file is named as GloVe 6B's" if vectors.corpus == "6B"
                  else "ones, of its width from a file not named as GloVe 6B's")
        body += para(f"The seed's own figures come from {SEED_GLOVE}, so they differ from this page's {theirs}:",
                     "other vectors give another semantic distance, and the encoding's share of the sum is set by",
                     "the two norms (the encoding's is sqrt(d/2), a word vector's is whatever GloVe learned). What",
                     "must carry over is the pattern, which the seed's figures show",
                     f"too{' and the check above finds here' if pattern else ' but this page does not'}.",
                     "With GloVe 6B's own 100-wide file the page computes with the seed's vectors." if vectors.corpus
                     == "6B" and d == SEED_WIDTH else
                     f"With <code>--glove {SEED_GLOVE}</code> the page computes with the seed's vectors.")
    return body, red_wolf, pattern, seeds_own


def _weightings(exp: _Experiment, words: list[list[str]], groups: list[list[str]], semantic: np.ndarray,
                d: int, seeds_own: bool, missing: bool) -> tuple[str, dict[str, float], bool]:
    """Sentence 1 at four weightings of meaning against position, each layout's Procrustes disparity from the
    semantic-only ``semantic`` (11, 2): (html, disparities by weighting, their order holds). ``d``: the vectors'
    width; ``seeds_own``: whether they are the seed's (see :func:`matches_seed`); ``missing``: whether some words
    have no vector (their groups cannot come back together)."""
    sqrt_d = math.sqrt(d)
    weightings = [*WEIGHTINGS, (sqrt_d, 1.0, "sqrt_d:1", f"sqrt(d) = {sqrt_d:.2f}, the encoder's ratio")]
    layouts = [pca_layout(exp.weighted(w1, w2, 1)) for w1, w2, _, _ in weightings]
    try:
        disparity = {key: float(procrustes(semantic, layout)[2])
                     for (_, _, key, _), layout in zip(weightings, layouts)}
    except ValueError as err:  # degenerate layouts, e.g. when almost every word is missing
        raise AttnlabError(f"cannot compare the layouts of the sentences' words (scipy: {err})") from err
    # What the bottom row shows is said from its disparities, not assumed: vectors of small norm (or few words
    # present) leave position a large share even at 10:1.
    kept = {key: disparity[key] < KEPT_DISPARITY for key in ("10:1", "sqrt_d:1")}
    body = heading("Choosing the relative weight")
    body += para("Sentence 1 as W1 &middot; embedding + W2 &middot; encoding. The encoder multiplies the embedding",
                 f"by sqrt(d) = {fmt(sqrt_d, 3)} before adding the encoding, which is the last panel.")
    body += figure(figures.word_panels(layouts, [words[1]] * 4, [groups[1]] * 4,
                                       [f"W1:W2 = {_shown(key)}, {note}" for _, _, key, note in weightings]),
                   "PCA of sentence 1 at four weightings of meaning against position",
                   "Position-heavy (top left) the words arrange themselves by position and the groups dissolve; "
                   + ("meaning-heavy (bottom row) the layout moves back toward the semantic one, but with these "
                      "vectors position still reshapes it (the disparities below)." if not all(kept.values()) else
                      "meaning-heavy (bottom row) the layout returns to the semantic one, the words without a vector "
                      "still on one point (the note above)." if missing else
                      "meaning-heavy (bottom row) the groups come back, with position as a small perturbation."))
    body += para("Procrustes disparity of each layout from the semantic-only one (0 = same shape after rotation,",
                 "scaling and shifting; 1 = no relation):")
    # At the seed's width the encoder's ratio sqrt(d):1 is 10:1, whose disparity the seed gives.
    seed_column = {**SEED_DISPARITY, "sqrt_d:1": SEED_DISPARITY["10:1"]}
    seed_ratio = f" (sqrt({SEED_WIDTH}) = {math.sqrt(SEED_WIDTH):g}: its 10:1)"
    body += table(["W1:W2", f"disparity, d = {d}", f"seed 000, d = {SEED_WIDTH}"],
                  [(_shown(key), f"{disparity[key]:.6f}",
                    f"{seed_column[key]:.6f}{seed_ratio if key == 'sqrt_d:1' else ''}") for _, _, key, _ in weightings])
    at_encoder = (f"at the encoder's own ratio the disparity is {disparity['sqrt_d:1']:.4f}: this arrangement "
                  "survives almost unchanged" if kept["sqrt_d:1"] else
                  f"at the encoder's own ratio the disparity is {disparity['sqrt_d:1']:.4f}: with these vectors "
                  "position still reshapes the arrangement")
    body += para("It compares two 2-D projections of eleven words, so it is a demonstration, not a general law;",
                 f"{at_encoder}. It is the sum of squared",
                 "distances left after the best fit, both layouts standardised first, not a percentage of structure",
                 "lost: 0.5 does not mean half the arrangement is gone.")
    ordered = disparity["1:10"] > disparity["1:1"] > disparity["10:1"]
    body += check(ordered, "the more weight meaning gets, the closer the layout stays to the semantic one "
                           "(1:10 > 1:1 > 10:1), as in the seed")
    if not seeds_own:
        body += para(f"The seed's disparities come from {SEED_GLOVE}, other vectors than this page's, so the two",
                     "columns differ: they are compared for their order only.")
    return body, disparity, ordered


def glove_section(vectors: WordVectors, max_length: int) -> Section:
    """Section 3, on the given word vectors; the encoding width is the vectors' width."""
    d = vectors.dim
    word_index, sequences, counts = build_vocabulary()
    index_to_word = {i: w for w, i in word_index.items()}
    data = pad_post(sequences, max_length)  # (2, L)
    matrix, missing = embedding_matrix(word_index, vectors)
    if len(missing) == len(word_index):
        raise AttnlabError(f"{vectors.source} holds none of the {len(word_index)} words of the sentences")
    lacking = [w for w in PAIR if w in missing]
    if lacking:  # a zero vector would make the red/wolf distances, and the check on them, meaningless
        raise AttnlabError(f"{vectors.source} has no vector for {' or '.join(lacking)}, which section 3 compares "
                           f"(the words it lacks: {', '.join(missing)}); use a GloVe 6B file")
    present = matrix[[i for w, i in word_index.items() if w not in missing]]  # (present words, d)
    if torch.unique(present, dim=0).shape[0] < 2:  # every layout below would be one point
        raise AttnlabError(f"{vectors.source} gives the sentences' words one and the same vector: there is no "
                           "arrangement of meaning to draw")
    embedding = torch.nn.functional.embedding(data, matrix)  # (2, L, d): a frozen lookup table
    encoding = sinusoidal_encoding(max_length, d, dtype=torch.float64)  # (L, d)
    words = [[index_to_word[i] for i in seq] for seq in sequences]
    exp = _Experiment(words, embedding, encoding, [len(s) for s in sequences])
    groups = [[GROUPS[w] for w in ws] for ws in words]

    body = para(f"Word vectors: <b>{esc(vectors.source)}</b>. The encoding is built {d} wide to match them,",
                f"over {max_length} positions.")
    body += heading("Two engineered sentences")
    body += code("\n".join(f"sentence {i}: {' '.join(s.split())}" for i, s in enumerate(SENTENCES)))
    body += para("The same eleven words from four groups (people, animals, sports, colours): neighbours in the",
                 "first sentence, scattered in the second. Only the order differs.")
    body += heading("Vocabulary and padding")
    body += para("Counting the words and numbering them from 1 is the whole tokenizer. Every word occurs twice,",
                 "so the tie falls back on first appearance; id 0 stays free for padding.")
    body += table(["word", "count", "id"], [(w, counts[w], i) for w, i in word_index.items()])
    body += code(
        f"padded ids: shape {tuple(data.shape)} (post-padding with {PAD_ID})\n"
        + "\n".join(f"sentence {i}, first {min(13, max_length)}: {data[i, :13].tolist()}" for i in range(2))
    )
    body += heading("Embedding matrix")
    body += code(f"embedding matrix: shape {tuple(matrix.shape)} (row 0 = padding, all zeros)\n"
                 f"words with no GloVe vector: {', '.join(missing) if missing else 'none'}\n"
                 f"embedded sentences: shape {tuple(embedding.shape)}")
    if missing:  # said where it matters, not only in the listing above
        body += para(f"<b>{len(missing)} of the {len(word_index)} words have no vector in this file</b>",
                     f"({esc(', '.join(missing))}): their rows are zeros, so without position they share one point,",
                     "and the groups they belong to cannot come back together below. They stay in every figure and",
                     "in every fit of this section, at that point (with position, at their encodings alone).")

    semantic = [pca_layout(exp.weighted(1.0, 0.0, s)) for s in (0, 1)]
    with_pos = [pca_layout(exp.weighted(1.0, 1.0, s)) for s in (0, 1)]
    body += heading("Without position, then with it")
    body += figure(figures.word_panels(semantic, words, groups,
                                       ["Sentence 0, semantic only", "Sentence 1, semantic only"]),
                   "PCA of the eleven word vectors for both sentences, without positional encoding",
                   "Each point is labelled word@position, counting from 0 as the encoding does. Without position "
                   "the two panels show the same points: a word vector does not know where "
                   "the word sits, so a model seeing only these cannot tell the sentences apart.")
    body += figure(figures.word_panels(with_pos, words, groups,
                                       ["Sentence 0, meaning + position (1:1)", "Sentence 1, meaning + position (1:1)"]),
                   "PCA of the eleven word vectors for both sentences, with positional encoding added at weight 1",
                   "With the encoding added at equal weight the two panels differ: the same word now carries a "
                   "different position vector in each sentence.")

    part, red_wolf, pattern, seeds_own = _red_and_wolf(exp, words, vectors)
    body += part
    part, disparity, ordered = _weightings(exp, words, groups, semantic[1], d, seeds_own, bool(missing))
    body += part

    numbers = {
        "source": vectors.source,
        "dim": d,
        "max_length": max_length,
        "word_index": word_index,
        "padded_shape": list(data.shape),
        "sequences": sequences,
        "embedding_matrix_shape": list(matrix.shape),
        "missing_words": missing,
        "red_wolf": red_wolf,
        "red_wolf_pattern_holds": pattern,
        "disparity": disparity,
        "disparity_ordered": ordered,
        "layouts": {"semantic": [lay.tolist() for lay in semantic], "with_position": [lay.tolist() for lay in with_pos]},
    }
    highlights = [("GloVe source", vectors.source)]
    highlights += [(f"red/wolf, sentence {s} (gap {red_wolf[f'sentence{s}']['gap']})",
                    f"semantic {red_wolf[f'sentence{s}']['semantic']:.3f}, "
                    f"with position {red_wolf[f'sentence{s}']['with_position']:.3f}") for s in (0, 1)]
    highlights.append(("disparity from semantic layout", ", ".join(f"{_shown(k)} {v:.6f}" for k, v in disparity.items())))
    if missing:
        highlights.append(("words missing from GloVe", ", ".join(missing)))
    return Section("glove", "Positional encoding meets word embeddings", numbers, body, highlights)
