"""The run viewer's routes: the ``/runs`` page and its read-only JSON API (GET only).

Takes: the :class:`~storyforge.studio.api.Studio` (its ``runs``, a
:class:`~storyforge.studio.runs.Runs` or None) and the server's handler wrapper. Gives:
:func:`run_routes`, the routes :func:`storyforge.studio.server.create_app` mounts inside its
guard. Why a module of its own: the server stays a short list of routes and safety rules.
Every route names a run or sweep by the name listed at start; none takes a path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from storyforge.studio.api import Studio, StudioError
from storyforge.studio.errors import query_int

__all__ = ["run_routes"]


STATIC_DIR = Path(__file__).resolve().parent / "static"

Handler = Callable[[Callable[[Request], Awaitable[Any]]], Callable[[Request], Awaitable[Response]]]


def run_routes(studio: Studio, handler: Handler) -> list[Route]:
    """The ``/runs`` page and ``/api/runs/...`` routes (answering 404 when no folder was given)."""

    def runs() -> Any:
        if studio.runs is None:
            raise StudioError(
                "no runs folder: start the studio with --runs DIR, or where outputs/ or multirun/ is",
                status=404,
            )
        return studio.runs

    async def page(request: Request) -> Response:
        return FileResponse(STATIC_DIR / "runs.html", media_type="text/html")

    async def listing(request: Request) -> Any:
        if studio.runs is None:
            return {"root": None, "entries": []}
        return {"root": ", ".join(studio.runs.folders), "entries": studio.runs.listing()}

    async def run(request: Request) -> Any:
        return runs().run(request.query_params.get("name", ""))

    async def answers(request: Request) -> Any:
        query = dict(request.query_params)
        return runs().answers(query.pop("name", ""), query)

    async def answer(request: Request) -> Any:
        row = query_int(request.query_params, "row")
        return runs().answer(request.query_params.get("name", ""), row, render=studio.render_checked)

    async def sweep(request: Request) -> Any:
        return runs().sweep(request.query_params.get("name", ""))

    async def sweep_plot(request: Request) -> Response:
        from storyforge.studio.runs import read_no_link

        query = request.query_params
        try:
            path = runs().sweep_plot(query.get("name", ""), query.get("file", ""))
            data = read_no_link(path)  # a regular file, never a link made since the check
        except StudioError as exc:
            return JSONResponse({"error": str(exc), "issues": []}, status_code=exc.status)
        except OSError:
            return JSONResponse({"error": "the plot is not a regular file", "issues": []}, status_code=404)
        return Response(data, media_type="image/png")

    async def compare(request: Request) -> Any:
        query = request.query_params
        return runs().compare(query.get("a", ""), query.get("b", ""), query_int(query, "offset", 0))

    return [
        Route("/runs", page),
        Route("/api/runs", handler(listing)),
        Route("/api/run", handler(run)),
        Route("/api/run/answers", handler(answers)),
        Route("/api/run/answer", handler(answer)),
        Route("/api/sweep", handler(sweep)),
        Route("/api/sweep/plot", sweep_plot),
        Route("/api/compare", handler(compare)),
    ]
