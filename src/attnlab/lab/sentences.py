"""Seed 000's two engineered sentences and the semantic group of each word.

Kept apart from :mod:`attnlab.lab.embeddings` (which needs scikit-learn and scipy) so that the words to
look up in GloVe are known before anything heavy is imported.
"""

from __future__ import annotations

#: The same eleven words from four groups, neighbours first, then scattered (the double spaces are the
#: seed's; splitting on whitespace ignores them).
SENTENCES = (
    "king queen man woman dog wolf football basketball red green yellow",
    "man queen yellow basketball green dog  woman football  king red wolf",
)
GROUPS = {
    "king": "people", "queen": "people", "man": "people", "woman": "people",
    "dog": "animals", "wolf": "animals",
    "football": "sports", "basketball": "sports",
    "red": "colours", "green": "colours", "yellow": "colours",
}


def needed_words() -> list[str]:
    """Every word of the two sentences, once, in order of first appearance."""
    return list(dict.fromkeys(w for s in SENTENCES for w in s.split()))
