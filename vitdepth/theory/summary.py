"""summary.md of ``vitdepth theory``: the tables a reader needs, from the rows the CSVs hold."""

from __future__ import annotations


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _cell(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def summary_markdown(bound: list[dict], counter: dict, paths: list[dict], errors: dict[str, float]) -> str:
    """Counterexample line, per-layer bound verdicts, violations, spread rates and the path curve."""
    out = ["# Theory checks (Dong et al. 2021)", "",
           f"- Lemma A.1, Eqn. (12): ||D 1 softmax(r)ᵀ R W_V||_1 = {counter['lhs']:g} but "
           f"||D 1||_∞ ||R||_1 ||W_V||_1 = {counter['rhs']:g} (D = diag(2, 3), softmax(r) = [0.8, 0.2]ᵀ, "
           f"R = W_V = I): the claimed inequality {'holds' if counter['holds'] else 'fails'}.", "",
           "## One-step bound ||res(SA(X))|| <= c ||res(X)||³, c = 4γβH/√d_qk, γ = 1", "",
           "ratio = max over images of measured / bound (= the γ the bound would need); verdicts "
           "(s = 2(1 − 1/N), the mean-centring slack): holds (<= 1/s³), inconclusive (<= s), violated (> s), "
           "floor (output residual below float64 rounding). spread = max_{i,j,j'} (E_ij − E_ij'), E = R W_QK Rᵀ/√d_qk over (image, head) pairs.", ""]
    out.append(_table(
        ["model", "stage", "layer", "β", "r_in", "r_out", "bound", "ratio", "verdict", "failed assumptions",
         "spread > 1", "spread > 1.256", "max spread", "log10 chain bound", "log10 r_block"],
        [[r["model"], r["stage"], r["layer"], r["beta"], r["r_in"], r["r_out"], r["bound"], r["ratio"], r["verdict"],
          r["step_assumptions_failed"] or "none", r["frac_spread_gt1"], r["frac_spread_gt1_256"], r["spread_max"],
          r["log10_chain_bound"], r["log10_r_block"]] for r in bound]))
    bad = [r for r in bound if r["verdict"] == "violated"]
    out += ["", "Violations: " + ("none." if not bad else "; ".join(
        f"{r['model']} {r['stage']} layer {r['layer']} (ratio {r['ratio']:.3g}; assumptions failed: "
        f"{r['step_assumptions_failed'] or 'none'})" for r in bad))]
    unexplained = [r for r in bad if not r["step_assumptions_failed"]]
    out += [f"Violations where every step assumption holds: {len(unexplained)}."]
    if paths:
        out += ["", "## Accuracy vs max path length (attention + skip, no MLP; maps and LayerNorm σ frozen)", ""]
        out.append(_table(["model", "k", "accuracy", "paths ≤ k", "norm share of length k"],
                          [[r["model"], r["max_path_length"], r["accuracy"], r["n_paths"], r["term_norm_share"]]
                           for r in paths]))
        out += [""] + [f"- {model}: Σ_k T_k reproduces the last-layer tokens to {err:.1e} (relative max)."
                       for model, err in errors.items()]
    return "\n".join(out) + "\n"
