"""Fixtures for the studio tests (the pieces live in studio_support.py)."""

from __future__ import annotations

from studio_support import artifacts, studio

__all__ = ["artifacts", "studio"]
