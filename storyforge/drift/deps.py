"""The drift gate's optional packages, checked before any work starts.

Takes: the import names a part of the gate needs. Gives: :func:`require`, which raises
:class:`storyforge.extras.MissingExtra` (a :class:`~storyforge.errors.ConfigError`: the gate
could not run, exit 2) naming the missing package and the extra that installs it.

Why: a package missing at render time would surface per example (a template that "fails"
on every example is drift, exit 1); a missing package is a broken install, not a finding.
"""

from __future__ import annotations

import importlib.util

from storyforge.extras import MissingExtra

__all__ = ["TRAINING", "MissingExtra", "require"]

#: What the training side needs (transformers renders with jinja2; tokenizers splits text).
TRAINING = ("transformers", "tokenizers", "jinja2")
_EXTRA = "drift"


def require(*modules: str) -> None:
    """:class:`MissingExtra` for the first of ``modules`` that cannot be imported."""
    for name in modules:
        if importlib.util.find_spec(name) is None:
            raise MissingExtra(
                f"the drift gate could not run: the Python package {name!r} is not installed "
                f"(pip install 'storyforge[{_EXTRA}]')"
            )
