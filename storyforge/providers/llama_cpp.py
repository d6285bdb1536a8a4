"""``provider=llama_cpp``: a llama.cpp ``llama-server`` the run starts for one GGUF file.

Takes: a :class:`~storyforge.config.provider.LlamaCppProviderConf` (``gguf``, ``model``,
``server_bin``, ``threads``, ``context``, ``concurrency``, ``max_tokens`` and the sampling settings
of ``provider=openai``). Gives: :class:`LlamaCppProvider` (the OpenAI-compatible client of
``provider=openai``, under its own name) and :func:`serve`, which the runner calls before a pass
sends anything: it starts the server, or reuses the one already running, and returns the
settings pointed at it; :func:`stop_servers` stops them (the pipeline calls it when the job
ends, also on Ctrl-C and errors; an exit handler and the kernel's parent-death signal cover
the rest, so no server outlives its run).

The server: ``llama-server -m GGUF --alias MODEL --host 127.0.0.1 --port FREE -np CONCURRENCY
-c CONCURRENCY*CONTEXT -t THREADS``, its output in ``llama-server.log`` in the run directory; the
command line and the log's path are logged. ``--alias`` makes the server answer with the name
the requests ask for, so the journal, the response cache and the price (``pricing.models``)
all key on ``provider.model``. One slot per worker (``-np`` = ``provider.concurrency``): a
request never queues behind another inside the server, where it could time out and be sent
again. The context per slot, unless ``provider.context`` gives it, is the pass's longest request
(its JSON body's bytes / 3, more than its tokens for any text) plus ``max_tokens``, rounded up
to 256; a later pass with longer requests (repair conversations, the judge) restarts the server
with a larger context, and a pass that fits reuses it.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import math
import shlex
from pathlib import Path
from typing import Any

from storyforge.config.provider import LlamaCppProviderConf
from storyforge.errors import ConfigError, ProviderError
from storyforge.providers.openai import OpenAIProvider

__all__ = ["LlamaCppProvider", "context_per_slot", "serve", "stop_servers"]

log = logging.getLogger(__name__)

LOG_NAME = "llama-server.log"
_ROUND = 256
_MARGIN = 64  # the chat template's own tokens around the messages


class LlamaCppProvider(OpenAIProvider):
    """The OpenAI-compatible client, talking to the server :func:`serve` started."""

    name = "llama_cpp"

    def __init__(self, conf: LlamaCppProviderConf) -> None:
        super().__init__(conf)
        self._gguf = conf.gguf

    def describe(self) -> dict[str, Any]:
        """The manifest's entry: the model file instead of the server's passing loopback URL."""
        described = {k: v for k, v in super().describe().items() if k not in ("url", "api_key_env")}
        return {**described, "gguf": self._gguf}


def context_per_slot(conf: LlamaCppProviderConf, longest_body_bytes: int) -> int:
    """Tokens of context one slot needs for a pass whose longest request body is this long."""
    if conf.context is not None:
        return conf.context
    need = math.ceil(longest_body_bytes / 3) + (conf.max_tokens or 512) + _MARGIN
    return _ROUND * math.ceil(need / _ROUND)


@dataclasses.dataclass(slots=True)
class _Running:
    server: Any  # storyforge.providers.llama_server.LlamaServer
    per_slot: int


_servers: dict[tuple[Any, ...], _Running] = {}


def serve(conf: LlamaCppProviderConf, *, longest_body_bytes: int, log_dir: Path) -> LlamaCppProviderConf:
    """``conf`` pointed at a running server for it, started (or restarted larger) when needed."""
    from storyforge.providers.llama_server import LlamaServer, llama_server_path

    key = (conf.gguf, conf.model, conf.server_bin, conf.threads, conf.concurrency, tuple(conf.server_args))
    per_slot = context_per_slot(conf, longest_body_bytes)
    running = _servers.get(key)
    if running is not None and running.server.running and running.per_slot >= per_slot:
        return dataclasses.replace(conf, base_url=running.server.base_url)
    if running is not None:
        log.info(
            "llama-server: restarting with %d tokens of context per slot (was %d)", per_slot, running.per_slot
        )
        running.server.terminate()
        del _servers[key]
    binary = Path(conf.server_bin) if conf.server_bin is not None else llama_server_path()
    if not binary.is_file():
        raise ConfigError(
            f"provider=llama_cpp: no llama-server at {binary}; build it once with "
            "`storyforge setup-model --server-only` or set provider.server_bin=PATH"
        )
    log_dir.mkdir(parents=True, exist_ok=True)
    server = LlamaServer(
        conf.gguf,
        alias=conf.model,
        context=per_slot * conf.concurrency,
        parallel=conf.concurrency,
        threads=conf.threads,
        binary=binary,
        log_path=log_dir / LOG_NAME,
        extra_args=tuple(map(str, conf.server_args)),
    )
    log.info("llama-server: starting %s", shlex.join(server.command()))
    log.info("llama-server: its log is %s", server.log_path)
    try:
        server.start(timeout_s=conf.startup_timeout_s)
    except RuntimeError as exc:
        what = str(exc).splitlines()[0].rstrip(":")
        last = [line for line in server.log_tail().splitlines() if line.strip()][-1:] or ["(empty)"]
        raise ProviderError(
            f"provider=llama_cpp: {what}; its log {server.log_path} ends with: {last[0].strip()}"
        ) from None
    except BaseException:  # Ctrl-C while the model loads
        server.stop()
        raise
    _servers[key] = _Running(server=server, per_slot=per_slot)
    log.info("llama-server: serving %s as %r at %s", conf.gguf, conf.model, server.base_url)
    return dataclasses.replace(conf, base_url=server.base_url)


def stop_servers() -> None:
    """Stop every server :func:`serve` started (SIGTERM, then SIGKILL after a grace period)."""
    while _servers:
        _, running = _servers.popitem()
        if running.server.running:
            running.server.terminate()
            log.info("llama-server: stopped (log: %s)", running.server.log_path)


atexit.register(stop_servers)
