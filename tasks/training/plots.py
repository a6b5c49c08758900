"""Small matplotlib helpers shared by the synthetic tasks. matplotlib is optional on a bare GPU node: without
it the figure is skipped with a note (the curves are in metrics.jsonl anyway, the registry can plot them later)."""
from __future__ import annotations

from typing import Any


def pyplot() -> Any | None:
    try:
        import matplotlib  # matplotlib: optional, loaded only when a figure is drawn

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[dpx] matplotlib is not installed: figure skipped (curves are in metrics.jsonl)", flush=True)
        return None
    return plt


def save(ctx, fig, name: str) -> None:
    import matplotlib.pyplot as plt  # matplotlib: loaded by pyplot() before any figure reaches here

    try:
        ctx.save_figure(fig, name)
    finally:
        plt.close(fig)
