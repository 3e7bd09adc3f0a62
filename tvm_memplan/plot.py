"""The memory-layout picture: time on x, byte offset on y, one rectangle per tensor."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .planning import Problem


def plot_layout(
    problem: Problem,
    offsets: Sequence[int],
    path: str | Path,
    title: str = "",
    arena_bytes: int | None = None,
) -> Path:
    """Draw the placement to ``path`` (PNG/SVG/PDF by extension) and return the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    path = Path(path)
    fig, ax = plt.subplots(figsize=(11, 5.5), dpi=110)
    cmap = plt.get_cmap("tab20")
    scale, unit = _unit(
        max([o + b.size for b, o in zip(problem.buffers, offsets, strict=True)] + [arena_bytes or 0, 1])
    )
    for index, (buffer, offset) in enumerate(zip(problem.buffers, offsets, strict=True)):
        if buffer.size == 0:
            continue
        aliased = index in problem.aliases
        ax.add_patch(
            Rectangle(
                (buffer.start, offset / scale),
                buffer.end - buffer.start,
                buffer.size / scale,
                facecolor=cmap(index % 20),
                edgecolor="black",
                linewidth=0.3,
                # Tensors living inside another (in-place outputs, concat slices) are hatched
                # and translucent so the tensor they share bytes with shows through.
                hatch="///" if aliased else None,
                alpha=0.55 if aliased else 1.0,
            )
        )
    bound = problem.lower_bound()
    horizon = max(problem.horizon(), 1)
    ax.axhline(
        bound / scale, color="tab:red", linestyle="--", linewidth=1, label=f"lower bound {bound / scale:,.2f} {unit}"
    )
    if arena_bytes is not None:
        ax.axhline(arena_bytes / scale, color="black", linewidth=1, label=f"arena {arena_bytes / scale:,.2f} {unit}")
    ax.set_xlim(0, horizon)
    ax.set_ylim(0, max(arena_bytes or 0, bound) / scale * 1.05 or 1)
    ax.set_xlabel("execution step")
    ax.set_ylabel(f"offset ({unit})")
    ax.set_title(title or "memory layout")
    if problem.aliases:
        ax.add_patch(
            Rectangle(
                (0, 0),
                0,
                0,
                facecolor="white",
                edgecolor="black",
                hatch="///",
                label="shares bytes (in-place / concat slice)",
            )
        )
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _unit(nbytes: int) -> tuple[float, str]:
    for scale, unit in ((1 << 20, "MiB"), (1 << 10, "KiB")):
        if nbytes >= 4 * scale:
            return float(scale), unit
    return 1.0, "B"
