"""Unique names for generated code and graphs (GLSL variables, ONNX nodes and tensors)."""

from __future__ import annotations


def unique_name(stem: str, used: set[str], first_suffix: int = 1) -> str:
    """``stem``, or else ``stem_N`` for the first ``N`` from ``first_suffix`` up that ``used`` does not
    hold; the name returned is added to ``used``."""
    name, suffix = stem, first_suffix
    while name in used:
        name = f"{stem}_{suffix}"
        suffix += 1
    used.add(name)
    return name
