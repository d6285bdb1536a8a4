"""Structured output: a provider whose requests carry a JSON Schema in the server's own form.

Takes: a built :class:`~storyforge.providers.base.Provider`, a JSON Schema and the dialect
(``openai``: ``response_format: {type: json_schema, json_schema: {name, schema, strict}}``;
``llama_cpp``: llama-server's top-level ``json_schema``; ``ollama``: ``format``; ``auto``: the
OpenAI form on the OpenAI-compatible API and ``format`` on Ollama's). Gives:
:class:`StructuredProvider`, the same provider with the schema added to every body (and so to
every request hash: a verdict cached under one schema is never reused under another).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from storyforge.providers.base import ChatRequest, Provider, Wrapper

__all__ = ["StructuredProvider", "structured_fields"]


def structured_fields(dialect: str, provider_name: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """The body fields that hand ``schema`` to the server."""
    if dialect == "auto":
        dialect = "ollama" if provider_name == "ollama" else "openai"
    if dialect == "ollama":
        return {"format": dict(schema)}
    if dialect == "llama_cpp":
        return {"json_schema": dict(schema)}
    return {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "verdict", "schema": dict(schema), "strict": True},
        }
    }


class StructuredProvider(Wrapper):
    """``inner`` with ``fields`` added to every request body; everything else is ``inner``'s."""

    def __init__(self, inner: Provider, fields: Mapping[str, Any]) -> None:
        super().__init__(inner)
        self._fields = dict(fields)

    def body(self, request: ChatRequest) -> dict[str, Any]:
        return {**self.inner.body(request), **self._fields}

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "structured_output": sorted(self._fields)}
