"""Init-only predictors of trainability, from a run's probe at init (no torch).

Every predictor is a number per run, computed from layers.csv's epoch -1 rows and gradients.csv,
so a report scores them from committed run directories alone. Larger is predicted to train better
(the sign of each definition is fixed here, before scoring, never fitted to the outcome).

- ``rel_residual``: log10 of the last layer's relative residual from rank 1 (Dong, Cordonnier &
  Loukas 2021, arXiv:2103.03404, their res(X) / ||X||), floored at the probe dtype's noise.
- ``attn_entropy``: the lowest normalised attention entropy over blocks: near 0 one key takes all
  the attention ("entropy collapse", Giorlandino & Goldt 2025, arXiv:2505.24333; Zhai et al. 2023,
  arXiv:2303.06296).
- ``angle_exponent``: the per-layer Lyapunov exponent of the angle between tokens,
  (1/L) ln((1 - c_L) / (1 - c_0)) with c_l the mean token cosine of layer l. Cowsik, Nebabu, Qi &
  Ganguli 2024 (arXiv:2403.02579) define their angle exponent by linearising the depth map of the
  token cosine around the collapsed fixed point (cosine 1): below 0 tokens converge (order, rank
  collapse), above 0 they spread (chaos); measured on a network, it is the per-layer slope of
  ln(1 - cos). Their abstract states that minimal test loss needs both exponents to vanish, so the
  predictor is -|exponent|; ``angle_total`` is -|L exponent|, the log change over the whole stack.
- ``gradient_exponent``: (1/L) ln(g_0 / g_L), g_l the norm of dL/dX_l at init (gradients.csv):
  above 0 gradients grow going down the stack (explode), below 0 they vanish. Cowsik et al. use
  the squared Frobenius norm of the input-output Jacobian, exp(λ_g L); this is the loss gradient's
  norm, not squared (half their λ_g where the loss gradient is a typical direction). Predictor
  -|exponent|, and ``gradient_total`` -|L exponent|.

Only the abstract of Cowsik et al. could be read here (no equation numbers are cited for that
reason); their block is pre-LN with residual strengths on attention and MLP, like ours.
Where a ViT needs a choice the theory does not make: the class token is one of the tokens (it is
what the head reads); X_0 is the embedding output after the position embedding; layer L is the last
block's output before the final LayerNorm; the cosine is averaged over the probe batch.
"""

from __future__ import annotations

import math

import numpy as np

from vitdepth.report.load import Run

PREDICTORS = ("rel_residual", "attn_entropy", "angle_exponent", "angle_total",
              "gradient_exponent", "gradient_total")
COSINE_FLOOR = 1e-7  # 1 - cosine below float32's epsilon is rounding noise


def init_profile(run: Run, metric: str) -> np.ndarray | None:
    return run.profile(metric, "init")


def angle_exponent(token_cosine: np.ndarray) -> float:
    distance = np.maximum(1.0 - token_cosine, COSINE_FLOOR)
    return float(np.log(distance[-1] / distance[0]) / (len(distance) - 1))


def gradient_exponent(grad_tokens: np.ndarray) -> float:
    return float(np.log(grad_tokens[0] / grad_tokens[-1]) / (len(grad_tokens) - 1))


def predictors(run: Run) -> dict[str, float]:
    """Every predictor of ``PREDICTORS`` for a run; nan where its init data is missing."""
    if run.init_predictors is not None:
        return dict(run.init_predictors)
    values = dict.fromkeys(PREDICTORS, math.nan)
    residual, cosine = init_profile(run, "rel_residual"), init_profile(run, "token_cosine")
    entropy = init_profile(run, "attn_entropy")
    if residual is not None:
        values["rel_residual"] = math.log10(max(residual[-1], run.probe_floor))
    if entropy is not None and np.isfinite(entropy[1:]).any():
        values["attn_entropy"] = float(np.nanmin(entropy[1:]))
    if cosine is not None and len(cosine) > 1:
        exponent = angle_exponent(cosine)
        values["angle_exponent"], values["angle_total"] = -abs(exponent), -abs(exponent) * (len(cosine) - 1)
    grads = run.gradients.get("grad_tokens")
    if grads is not None and len(grads) > 1 and (grads > 0).all():
        exponent = gradient_exponent(grads)
        values["gradient_exponent"] = -abs(exponent)
        values["gradient_total"] = -abs(exponent) * (len(grads) - 1)
    return values


def raw_exponents(run: Run) -> dict[str, float]:
    """The signed exponents (for tables and plots): angle and gradient, nan where missing."""
    cosine, grads = init_profile(run, "token_cosine"), run.gradients.get("grad_tokens")
    return {"angle": angle_exponent(cosine) if cosine is not None and len(cosine) > 1 else math.nan,
            "gradient": gradient_exponent(grads) if grads is not None and len(grads) > 1 else math.nan}


