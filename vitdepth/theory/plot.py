"""Figures of ``vitdepth theory``: bound vs measured, Lemma A.3 spread rates, accuracy vs path length."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def _groups(rows: list[dict]) -> list[tuple[str, str]]:
    return list(dict.fromkeys((r["model"], r["stage"]) for r in rows))


def plot_bound(rows: list[dict], path: Path) -> None:
    """Per model and stage: measured ||res(SA(X))||, the one-step bound c r_in^3 (γ = 1), and r_in.

    Red crosses mark violations; grey rings mark outputs below the float64 floor (unresolvable).
    """
    groups = _groups(rows)
    fig, axes = plt.subplots(1, len(groups), figsize=(3.4 * len(groups), 3.4), squeeze=False)
    for ax, (model, stage) in zip(axes[0], groups):
        sel = [r for r in rows if (r["model"], r["stage"]) == (model, stage)]
        layers = [r["layer"] for r in sel]
        ax.plot(layers, [r["bound"] for r in sel], "k--", marker="v", ms=4, label="bound c·r_in³ (γ=1)")
        ax.plot(layers, [r["r_out"] for r in sel], marker="o", ms=4, label="measured ‖res(SA(X))‖")
        ax.plot(layers, [r["r_in"] for r in sel], color="grey", lw=1, marker=".", label="‖res(X)‖ at SA input")
        for r in sel:
            if r["verdict"] == "violated":
                ax.plot(r["layer"], r["r_out"], "rx", ms=9)
            if r["verdict"] == "floor":  # rounding noise: the bound cannot be checked there
                ax.plot(r["layer"], r["r_out"], "o", ms=8, mfc="none", color="grey")
        ax.set_yscale("log")
        ax.set_title(f"{model} ({stage})", fontsize=9)
        ax.set_xlabel("layer")
    axes[0][0].set_ylabel("‖·‖₁,∞ (mean over images)")
    axes[0][0].legend(fontsize=7)
    _save(fig, path)


def plot_spread(rows: list[dict], path: Path) -> None:
    """Share of (image, head) pairs whose residual-logit spread max_ij,j' (E_ij − E_ij') exceeds 1."""
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for model, stage in _groups(rows):
        sel = [r for r in rows if (r["model"], r["stage"]) == (model, stage)]
        ax.plot([r["layer"] for r in sel], [r["frac_spread_gt1"] for r in sel], marker="o", ms=4,
                ls="-" if stage == "trained" else ":", label=f"{model} ({stage})")
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("layer")
    ax.set_ylabel("fraction with spread > 1")
    ax.set_title("Lemma A.3's missing assumption, max(E_ij − E_ij') ≤ 1", fontsize=9)
    ax.legend(fontsize=7)
    _save(fig, path)


def plot_paths(rows: list[dict], path: Path) -> None:
    """Accuracy of the model restricted to paths of length <= k, one line per model (k = depth: the model)."""
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for model in dict.fromkeys(r["model"] for r in rows):
        sel = [r for r in rows if r["model"] == model]
        ax.plot([r["max_path_length"] for r in sel], [r["accuracy"] for r in sel], marker="o", label=model)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("max path length k (attention branches traversed)")
    ax.set_ylabel("val accuracy")
    ax.set_title("model restricted to paths of length ≤ k", fontsize=9)
    ax.legend(fontsize=7)
    _save(fig, path)
