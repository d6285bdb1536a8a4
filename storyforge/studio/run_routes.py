"""The run viewer's routes: the read-only JSON API of the ``/runs`` page (GET only).

Takes: the :class:`~storyforge.studio.api.Studio` (its ``runs``, a
:class:`~storyforge.studio.runs.Runs` or None) and the server's handler wrapper. Gives:
:func:`run_routes`, the routes :func:`storyforge.studio.server.create_app` mounts inside its
guard. Why a module of its own: the server stays a short list of routes and safety rules.
Every route names a run or sweep by the name listed at start; none takes a path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from storyforge.studio.api import Studio, StudioError
from storyforge.studio.errors import query_int

__all__ = ["run_routes"]


Handler = Callable[[Callable[[Request], Any]], Callable[[Request], Awaitable[Response]]]


def run_routes(studio: Studio, handler: Handler) -> list[Route]:
    """The ``/api/runs/...`` routes (answering 404 when no folder was given)."""

    def runs() -> Any:
        if studio.runs is None:
            raise StudioError(
                "no runs folder: start the studio with --runs DIR, or where outputs/ or multirun/ is",
                status=404,
            )
        return studio.runs

    def listing(request: Request) -> Any:
        if studio.runs is None:
            return {"root": None, "entries": []}
        return {"root": ", ".join(studio.runs.folders), "entries": studio.runs.listing()}

    def answers(request: Request) -> Any:
        query = dict(request.query_params)
        return runs().answers(query.pop("name", ""), query)

    def answer(request: Request) -> Any:
        row = query_int(request.query_params, "row")
        return runs().answer(request.query_params.get("name", ""), row, render=studio.render_checked)

    def sweep_plot(request: Request) -> Response:
        from storyforge.studio.runs import read_no_link

        path = runs().sweep_plot(request.query_params.get("name", ""), request.query_params.get("file", ""))
        try:
            data = read_no_link(path)  # a regular file, never a link made since the check
        except OSError:
            raise StudioError("the plot is not a regular file", status=404) from None
        return Response(data, media_type="image/png")

    def compare(request: Request) -> Any:
        query = request.query_params
        return runs().compare(query.get("a", ""), query.get("b", ""), query_int(query, "offset", 0))

    return [
        Route("/api/runs", handler(listing)),
        Route("/api/run", handler(lambda request: runs().run(request.query_params.get("name", "")))),
        Route("/api/run/answers", handler(answers)),
        Route("/api/run/answer", handler(answer)),
        Route("/api/sweep", handler(lambda request: runs().sweep(request.query_params.get("name", "")))),
        Route("/api/sweep/plot", handler(sweep_plot)),
        Route("/api/compare", handler(compare)),
    ]
