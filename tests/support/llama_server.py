"""The tests' llama.cpp server: :class:`storyforge.providers.llama_server.LlamaServer` that
builds the cached binary first (:func:`storyforge.providers.llama_setup.ensure_llama_server`)
when none is given and none is cached, so a test never fails for want of the build."""

from __future__ import annotations

from pathlib import Path

from storyforge.providers.llama_server import LlamaServer as ServedLlama
from storyforge.providers.llama_setup import ensure_llama_server

__all__ = ["LlamaServer"]


class LlamaServer(ServedLlama):
    """A running ``llama-server`` on 127.0.0.1 (see the base class), built when missing."""

    def default_binary(self) -> Path:
        return self.binary if self.binary is not None else ensure_llama_server()
