"""collapse.png: relative residual vs layer, one panel per depth, a line per variant."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


def plot_collapse(rows: list[dict], floor: float, path: Path, title: str) -> None:
    """Mean over seeds as a line, min-max over seeds as a band; the dtype floor as a dotted line."""
    depths = sorted({r["depth"] for r in rows})
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    fig, axes = plt.subplots(1, len(depths), figsize=(3.2 * len(depths), 3.4), sharey=True, squeeze=False)
    for ax, depth in zip(axes[0], depths):
        for index, variant in enumerate(variants):
            curves = _curves(rows, variant, depth)
            layers = np.arange(curves.shape[1])
            shown = np.clip(curves, floor, None)
            # Distinct markers and dashes: skip and full (or pure and mlp) often overlap.
            line, = ax.plot(layers, shown.mean(0), marker="os^vDx*P"[index % 8], ms=4, mfc="none",
                            ls=("-", "--", ":", "-.")[index % 4], label=variant)
            ax.fill_between(layers, shown.min(0), shown.max(0), color=line.get_color(), alpha=0.2)
        ax.axhline(floor, color="grey", ls=":", lw=1)
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"depth {depth}")
        ax.set_xlabel("layer (0 = embedding)")
    axes[0][0].set_ylabel("relative residual ‖X−1x̄ᵀ‖₁,∞ / ‖X‖₁,∞")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def _curves(rows: list[dict], variant: str, depth: int) -> np.ndarray:
    """(seeds, layers) array of rel_residual."""
    seeds = sorted({r["seed"] for r in rows if r["variant"] == variant and r["depth"] == depth})
    return np.array([[r["rel_residual"] for r in sorted(rows, key=lambda r: r["layer"])
                      if r["variant"] == variant and r["depth"] == depth and r["seed"] == s] for s in seeds])
