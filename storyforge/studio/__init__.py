"""The template studio: a local web page to write, render and explain templates.

Takes: the store URL, a port and optionally a tokenizer file (``storyforge studio``). Gives: a
server on ``http://127.0.0.1:PORT/`` whose page shows, as the author types, every lint and
validation issue at its line, the rendered messages with their token counts, and the trace of
what the budget kept, dropped or skipped; and the template store's revisions, saves and diffs.

Pipeline: :mod:`storyforge.studio.api` (what a request computes, plain data) ->
:mod:`storyforge.studio.server` (routes, Host/Origin checks, body cap) -> ``static/`` (the page:
plain HTML, CSS and JavaScript, no build step, nothing loaded from elsewhere).

Needs the optional extra: ``pip install 'storyforge[studio]'`` (Starlette, uvicorn, SQLAlchemy, numpy).
"""

from __future__ import annotations

from storyforge.extras import require

for _module in ("starlette", "uvicorn", "sqlalchemy", "numpy"):
    require(_module, extra="studio", for_what="storyforge studio")

from storyforge.studio.api import Studio as Studio
from storyforge.studio.api import StudioError as StudioError

__all__ = ["Studio", "StudioError"]
