"""analysis.png in the style of Dong et al. 2021, Fig. 2: relative residual per layer, one line per
variant, band = ± std over inputs; a second row for the patch-token cosine; a column per weights
(init, pretrained/trained). Layers whose tokens vanished are marked x on the axis and named in the
panel: their scale-free metrics are undefined. Drawn and encoded the way ``vitdepth report`` draws
its figures."""

from __future__ import annotations

import textwrap

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from vitdepth.report.plots import png_bytes
from vitdepth.rundir import VANISHED

# Dong et al.'s names and line styles (walking_casual_transformers.ipynb)
STYLES = {
    "pure": ("SAN", ":"),
    "mlp": ("SAN + MLP", "--"),
    "skip": ("SAN + skip", "-."),
    "full": ("transformer", "-"),
}
PANELS = (
    ("rel_residual", "relative residual ‖res(X)‖₁,∞ / ‖X‖₁,∞"),
    ("token_cosine", "patch-token cosine"),
)


def analysis_png(rows: list[dict], provenance: dict) -> bytes:
    weights = sorted({r["weights"] for r in rows}, key=lambda w: (w != "init", w))
    variants = [v for v in STYLES if any(r["variant"] == v for r in rows)]
    fig = Figure(figsize=(3.4 * len(weights) + 0.4, 5.6), layout="constrained")
    axes = fig.subplots(len(PANELS), len(weights), squeeze=False, sharex=True)
    for column, weight in enumerate(weights):
        for row, (metric, label) in enumerate(PANELS):
            ax = axes[row][column]
            for index, variant in enumerate(variants):
                mine = sorted(
                    (r for r in rows if r["weights"] == weight and r["variant"] == variant),
                    key=lambda r: r["layer"],
                )
                layers = np.array([r["layer"] for r in mine])
                mean = np.array([r[f"{metric}_mean"] for r in mine])
                std = np.array([r[f"{metric}_std"] for r in mine])
                name, style = STYLES[variant]
                ax.plot(layers, mean, ls=style, color=f"C{index}", label=f"{name} ({variant})")
                ax.fill_between(layers, mean - std, mean + std, color=f"C{index}", alpha=0.2)
                gone = [r["layer"] for r in mine if r.get("tokens_vanished")]
                if gone:  # undefined, not 0: marked and said, never drawn as a value
                    ax.plot(gone, [0.0] * len(gone), "x", color=f"C{index}", clip_on=False)
                    ax.text(0.02, 0.04 + 0.07 * index, f"{variant}: {VANISHED} from layer "
                            f"{min(gone)} (x)", transform=ax.transAxes, fontsize="x-small",
                            color=f"C{index}")
            ax.set_ylim(bottom=min(0.0, ax.get_ylim()[0]))
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
            if column == 0:
                ax.set_ylabel(label)
            if row == 0:
                seeds = sorted({r["seeds"] for r in rows if r["weights"] == weight} - {""})
                ax.set_title(weight + (f" (seeds {', '.join(seeds)})" if seeds else ""))
            if row == len(PANELS) - 1:
                ax.set_xlabel("layer (0 = embedding output)")
    axes[0][0].legend(fontsize="small")
    width = 40 * len(weights) + 8  # characters that fit above the panels
    fig.suptitle(
        "\n".join(textwrap.wrap(f"{provenance['model']}: {provenance['inputs']}", width)),
        fontsize="small",
    )
    return png_bytes(fig)
