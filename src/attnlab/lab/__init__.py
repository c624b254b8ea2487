"""The lab: seed 000's measurements, seed 003's parameter summaries and seed 004's encoders and decoders.

``attnlab lab`` runs :func:`run_lab` (:mod:`.runner`), which computes ten sections with the project's own core
and writes ``index.html`` (self-contained, figures inline) and ``numbers.json``:

1. angles and encodings (:mod:`.encoding`)
2. properties of the encoding (:mod:`.encoding`)
3. positional encoding meets GloVe word vectors (:mod:`attnlab.data.glove` loads them, :mod:`.embeddings`
   measures)
4. masks (:mod:`.masks_demo`)
5. the model (:mod:`.model_checks`)
6. parameter summaries, seed 003 (:mod:`.parameters`)
7. order: the shuffle test (:mod:`.order`)
8. mask explorer (:mod:`.explorer`)
9. encoders and decoders, seed 004 (:mod:`.encoders_decoders`)
10. the port's silent bugs and the seed's review questions (:mod:`.silent_bugs`)

:mod:`.sentences` holds the seeds' sentences, :mod:`.figures` draws (matplotlib, Agg), :mod:`.html` formats,
:mod:`.report` assembles and writes.
"""

from attnlab.lab.runner import DEFAULT_MAX_LENGTH, STEPS, LabResult, run_lab

__all__ = ["DEFAULT_MAX_LENGTH", "STEPS", "LabResult", "run_lab"]
