"""A deterministic corpus of random templates with contexts, for the render benchmark.

Takes: ``--n`` (how many templates, default 2,000), ``--seed`` (default 25) and ``--out``
(a JSON file). Gives: that file, a list of ``{"template": ..., "ctx": ...}`` cases, each
template distinct, and each one compiled by storyforge (a template storyforge refuses is
dropped and counted on stderr).

How the cases are made: the hypothesis strategies of ``tests/support/template_strategies.py`` (the
ones the property tests use: every plan and layout feature, over the data-only sources
``xs objs text num none bad`` and the reserved ones) are drawn from one at a time, the way
hypothesis draws an example, with a ``random.Random(seed)`` as the only source of
randomness, and without the constants hypothesis would otherwise collect from the source of
the loaded modules. The same seed and the same hypothesis version give the same corpus, byte
for byte, whatever the code around it; duplicates are skipped, so ``n`` templates are always
distinct.

``bench/render_oracle.mjs`` reads the same file, so storyforge and the original engine
render exactly the same cases with equivalent sources (``SOURCES_JS`` there mirrors
``REGISTRY`` in ``tests/support/template_strategies.py``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def build_corpus(n: int, seed: int = 25) -> tuple[list[dict[str, Any]], int]:
    """``n`` distinct cases drawn with ``seed``, and how many drawn templates storyforge refused."""
    sys.path.insert(0, str(ROOT))
    from hypothesis import strategies as st
    from hypothesis.control import BuildContext
    from hypothesis.internal.conjecture.data import ConjectureData
    from hypothesis.internal.conjecture.providers import Constants, HypothesisProvider
    from hypothesis.internal.floats import float_to_int
    from sortedcontainers import SortedSet

    from storyforge import TemplateValidationError, compile_template
    from tests.support.template_strategies import CONTEXTS, templates

    class NoLocalConstants(HypothesisProvider):  # type: ignore[misc]
        """Hypothesis's own provider, minus the constants it would collect from the source of
        whatever modules are loaded (those change with the code and with the imports, and
        the corpus must not)."""

        @property
        def _local_constants(self) -> Any:
            return Constants(
                integers=SortedSet(),
                floats=SortedSet(key=float_to_int),
                bytes=SortedSet(),
                strings=SortedSet(),
            )

    rnd = random.Random(seed)
    strategy = st.tuples(templates(), CONTEXTS)
    seen: set[str] = set()
    cases: list[dict[str, Any]] = []
    refused = 0
    while len(cases) < n:
        data = ConjectureData(random=rnd, provider=NoLocalConstants)
        with BuildContext(data, is_final=False, wrapped_test=None):
            template, ctx = data.draw(strategy)
        key = json.dumps(template, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        try:
            compile_template(template)
        except TemplateValidationError:
            refused += 1
            continue
        cases.append({"template": template, "ctx": ctx})
    return cases, refused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="how many templates (default 2000)")
    parser.add_argument("--seed", type=int, default=25, help="seed of the random source (default 25)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    options = parser.parse_args()
    cases, refused = build_corpus(options.n, options.seed)
    options.out.write_text(json.dumps(cases, ensure_ascii=False), encoding="utf-8")
    print(f"{len(cases)} cases written to {options.out} ({refused} refused by storyforge)", file=sys.stderr)


if __name__ == "__main__":
    main()
