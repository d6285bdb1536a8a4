"""The train/serve equivalence gate: what the model sees, compared token by token.

Takes: exported conversations (:mod:`.examples`), a model's local tokenizer files (the
training side, :mod:`.training`) and the ways it is served (:mod:`.serving`: a GGUF, a
running llama-server, an OpenAI-compatible ``/tokenize``; :mod:`.ollama`: a Modelfile).
Gives: :func:`run_drift` -> :class:`DriftReport` (first divergence per example, classified
by :mod:`.compare`); ``storyforge drift`` (:mod:`.command`) and ``stage=drift`` run it.

Modules, in the order data flows: ``examples`` -> ``training`` / ``serving`` / ``ollama``
(with ``vocab`` and ``gotemplate``) -> ``compare`` -> ``report`` -> ``command``.
"""

from storyforge.drift.compare import KINDS as KINDS
from storyforge.drift.compare import Finding as Finding
from storyforge.drift.examples import Example as Example
from storyforge.drift.examples import read_examples as read_examples
from storyforge.drift.report import DriftReport as DriftReport
from storyforge.drift.report import needed_num_ctx as needed_num_ctx
from storyforge.drift.report import run_drift as run_drift

__all__ = ["KINDS", "DriftReport", "Example", "Finding", "needed_num_ctx", "read_examples", "run_drift"]
