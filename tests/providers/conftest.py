"""Fixtures for the provider tests (the pieces live in provider_support.py)."""

from __future__ import annotations

from provider_support import hydra_conf, server

__all__ = ["hydra_conf", "server"]
