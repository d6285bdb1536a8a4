"""Optional libraries: the lazy stand-in of a module and the message of a missing extra."""

from __future__ import annotations

import pytest

from storyforge import extras
from storyforge.extras import MissingExtra, lazy


def test_a_lazy_module_imports_once_then_reads_its_names_directly(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = extras.require

    def counted(module: str, **kw: object) -> object:
        calls.append(module)
        return real(module, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(extras, "require", counted)
    stand_in = lazy("json", extra="quality", for_what="a test")
    assert stand_in.dumps([1]) == "[1]"
    assert stand_in.dumps([2]) == "[2]"
    assert stand_in.loads("3") == 3
    assert calls == ["json", "json"]  # once per name, not once per use


def test_a_lazy_module_that_is_missing_names_its_extra() -> None:
    stand_in = lazy("no_such_module_here", extra="quality", for_what="near-duplicate detection (dedup)")
    with pytest.raises(MissingExtra, match=r"^near-duplicate detection \(dedup\) needs the 'quality' extra"):
        stand_in.anything  # noqa: B018
