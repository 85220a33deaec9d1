"""Breaking a private copy of recipes/ (the recipes_copy fixture of tests/conftest.py) one edit at a time."""

from __future__ import annotations


def _break(recipes, rel, old, new):
    path = recipes / rel
    text = path.read_text()
    assert old in text, f"test setup: {old!r} not in {rel}"
    path.write_text(text.replace(old, new, 1))
    return path
