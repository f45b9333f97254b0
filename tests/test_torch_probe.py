"""The probe's per-user cache key (harness.machine.torch_probe): two environments with the same
base interpreter and the same torch files behind a symlink still get keys of their own, so one
never reads the other's answer (its torch_path). Pure: nothing imports torch here."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os

from harness.machine import torch_probe


def _key_with_torch_at(monkeypatch, torch_dir: str) -> str:
    spec = importlib.machinery.ModuleSpec("torch", None,
                                          origin=os.path.join(torch_dir, "__init__.py"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    return torch_probe._cache_key()


def test_a_torch_found_elsewhere_through_a_symlink_gets_a_key_of_its_own(tmp_path, monkeypatch):
    real = tmp_path / "venv" / "torch"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("")
    (real / "version.py").write_text("__version__ = '2.13.0'\n")
    link = tmp_path / "torchsite"
    link.mkdir()
    (link / "torch").symlink_to(real)
    a = _key_with_torch_at(monkeypatch, str(real))
    b = _key_with_torch_at(monkeypatch, str(link / "torch"))
    assert a and b and a != b
    assert a == _key_with_torch_at(monkeypatch, str(real))    # and the same place, the same key
