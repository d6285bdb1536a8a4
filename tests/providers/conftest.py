"""Fixtures for the provider tests (the pieces live in provider_support.py)."""

from __future__ import annotations

from provider_support import server

__all__ = ["server"]
