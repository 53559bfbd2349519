"""Token-uniformity metrics of token matrices X (B, N, C), computed per sample in float64.

Every function returns one value per sample, shape (B,): a batch is never flattened into one
(B*N, C) matrix, because diversity between images would hide collapse within each image.
Formulas: Dong et al. 2021 (arXiv:2103.03404), Roy & Vetterli 2007 (effective rank), Gong et al. 2021 (arXiv:2104.12753).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor


def float64_no_autocast(fn):
    """Run a metric in float64 with autocast off: bf16 would floor every metric near 1e-2."""

    @functools.wraps(fn)
    def wrapper(*tensors: Tensor, **kwargs):
        with torch.autocast(tensors[0].device.type, enabled=False):
            return fn(*(t.detach().to(torch.float64) for t in tensors), **kwargs)

    return wrapper


def l1_norm(x: Tensor) -> Tensor:
    """Induced 1-norm of each matrix in (..., N, C): the largest column abs-sum."""
    return x.abs().sum(-2).amax(-1)


def linf_norm(x: Tensor) -> Tensor:
    """Induced inf-norm of each matrix in (..., N, C): the largest row abs-sum."""
    return x.abs().sum(-1).amax(-1)


def composite_norm(x: Tensor) -> Tensor:
    """Dong et al.'s ||X||_{1,inf} = sqrt(||X||_1 ||X||_inf); bounds the spectral norm from
    above."""
    magnitude = x.abs()  # once for both norms, not in each of l1 and linf
    return composite_of_sums(magnitude.sum(-2), magnitude.sum(-1))


def composite_of_sums(column_sums: Tensor, row_sums: Tensor) -> Tensor:
    """``composite_norm`` from the column and row sums of |X|."""
    return torch.sqrt(column_sums.amax(-1) * row_sums.amax(-1))


def residual_norms(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``composite_norm`` of ``token_residual(x)``, its Frobenius norm and ``composite_norm(x)``,
    (B,) each, from ``abs_sums`` of x in pieces: only the per-image sums leave the L2 cache."""
    return norms_of_sums(*in_pieces(abs_sums, x))


def norms_of_sums(res_col: Tensor, res_row: Tensor, fro: Tensor, x_col: Tensor,
                  x_row: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``residual_norms`` from ``abs_sums``."""
    return composite_of_sums(res_col, res_row), fro, composite_of_sums(x_col, x_row)


def abs_sums(x: Tensor) -> tuple[Tensor, ...]:
    """Column and row sums of |res(X)|, ||res(X)||_F, column and row sums of |X|: one residual
    serves both of its norms, written over |X| (no second buffer to bring into the cache) and
    its absolute values taken in place."""
    magnitude = x.abs()
    x_col, x_row = magnitude.sum(-2), magnitude.sum(-1)
    res = torch.sub(x, x.mean(dim=-2, keepdim=True), out=magnitude)  # token_residual(x)
    fro = torch.linalg.vector_norm(res, dim=(-2, -1))
    res.abs_()
    return res.sum(-2), res.sum(-1), fro, x_col, x_row


def token_grams(tokens: Tensor, per_piece: Callable[[Tensor], tuple[Tensor, ...]] = abs_sums
                ) -> tuple[Tensor, tuple[Tensor, ...]]:
    """The float64 token Gram matrices X Xᵀ (B, N, N) of ``tokens`` (B, N, C), N <= C, and
    ``per_piece`` (by default the residual's ``abs_sums``) of the float64 tokens. On the CPU each
    piece of images is cast to float64 where it is used (``in_pieces``), so float64 tokens never
    go to memory and back: the Gram product and ``per_piece`` read them from the L2 cache."""
    gram = tokens.new_empty(*tokens.shape[:-1], tokens.shape[-2], dtype=torch.float64)
    return gram, in_pieces(lambda x, into: per_piece(gram_into(x, into)), tokens, gram)


def gram_into(tokens: Tensor, gram: Tensor) -> Tensor:
    """``tokens`` in float64, their Gram matrices X Xᵀ written into ``gram``."""
    x = tokens.to(torch.float64)
    torch.matmul(x, x.transpose(-1, -2), out=gram)
    return x


PIECE_IMAGES = 4  # 4 x 65 x 192 float64 tokens (0.4 MB): a piece and its temporaries fit in L2


def in_pieces(fn: Callable[..., tuple[Tensor, ...]], *tensors: Tensor,
              size: int = PIECE_IMAGES) -> tuple[Tensor, ...]:
    """``fn(*tensors)`` for a per-image ``fn``, on the CPU ``size`` images at a time, its results
    concatenated: the same values, but each piece's memory-bound passes over float64 elements
    run in the core's L2 cache, not in L3 (the probe's 32-image chunks fill 3.2 MB per tensor).
    Other devices take the whole batch, as one launch per operation."""
    if tensors[0].device.type != "cpu" or len(tensors[0]) <= size:
        return fn(*tensors)
    parts = [fn(*piece) for piece in zip(*(t.split(size) for t in tensors), strict=True)]
    return tuple(torch.cat(part) for part in zip(*parts, strict=True))


def token_residual(x: Tensor) -> Tensor:
    """res(X) = X - 1 x̄ᵀ with x̄ the token mean, as in the authors' code (exact for Frobenius)."""
    return x - x.mean(dim=-2, keepdim=True)


@float64_no_autocast
def rel_residual(x: Tensor, norm: str = "composite") -> Tensor:
    """Relative distance to token uniformity, ||res(X)|| / ||X|| (Dong et al. 2021, Fig. 2).

    Args:
        x: tokens (B, N, C).
        norm: "composite" for sqrt(||.||_1 ||.||_inf) (the paper's), "fro" for Frobenius
            (equals Wang et al.'s high-frequency energy ratio ||HC[X]||_F / ||X||_F).
    """
    return residual_ratio(token_residual(x), x, norm)


def residual_ratio(res: Tensor, x: Tensor, norm: str = "composite") -> Tensor:
    """``rel_residual`` given res = ``token_residual(x)``, so several norms can share one residual."""
    if norm == "composite":
        return composite_norm(res) / composite_norm(x)
    if norm == "fro":
        return torch.linalg.matrix_norm(res, "fro") / torch.linalg.matrix_norm(x, "fro")
    raise ValueError(f"norm must be 'composite' or 'fro', got {norm!r}")


def squared_singular_values(x: Tensor) -> Tensor:
    """sigma_i^2 of each (N, C) matrix, descending, from the eigenvalues of the smaller Gram matrix.

    Several times cheaper than an SVD; in float64 it matches ``svdvals`` to ~1e-8 relative to
    sigma_1, far below what effective or stable rank can resolve.
    """
    return gram_spectrum(x @ x.transpose(-1, -2) if x.shape[-2] <= x.shape[-1] else x.transpose(-1, -2) @ x)


def gram_spectrum(gram: Tensor) -> Tensor:
    """Eigenvalues of Gram matrices X Xᵀ or Xᵀ X (..., K, K), descending: the sigma_i^2 of X.

    Samples with a non-finite entry in X get NaN (eigvalsh raises on them). Such an entry makes
    its row's (or column's) squared norm, a diagonal entry of the Gram matrix, non-finite, and a
    finite diagonal bounds every entry (Cauchy-Schwarz), so the diagonal alone tells.
    """
    bad = ~torch.isfinite(gram.diagonal(dim1=-2, dim2=-1)).all(-1)
    s2 = eigvalsh_in_threads(gram.masked_fill(bad[..., None, None], 0.0)).flip(-1).clamp_min(0)
    return s2.masked_fill(bad[..., None], float("nan"))


def eigvalsh_in_threads(matrices: Tensor) -> Tensor:
    """``torch.linalg.eigvalsh`` of a batch (..., K, K), split over torch's intra-op threads.

    On CPU, LAPACK solves a batch one matrix at a time on one core, and for the probe's small Gram
    matrices that is the largest single cost of the metrics; torch releases the GIL inside, so
    Python threads run the chunks in parallel. CUDA batches go to the CPU: cuSOLVER, as torch
    calls it, also solves matrices larger than 32x32 one at a time, one kernel launch after
    another, and on an H200 that took 1.4 s of a 1.9 s probe (results/bench/h200, section c).
    """
    if matrices.device.type == "cuda":
        return eigvalsh_in_threads(matrices.cpu()).to(matrices.device)
    flat = matrices.reshape(-1, *matrices.shape[-2:])
    workers = min(torch.get_num_threads(), flat.shape[0])
    if matrices.device.type != "cpu" or workers < 2:
        return torch.linalg.eigvalsh(matrices)
    with ThreadPoolExecutor(workers) as pool:
        parts = list(pool.map(torch.linalg.eigvalsh, flat.chunk(workers)))
    return torch.cat(parts).reshape(matrices.shape[:-1])


@float64_no_autocast
def effective_rank(x: Tensor) -> Tensor:
    """Roy & Vetterli (2007): exp of the entropy of the normalised singular values of uncentred X.

    1 for a rank-1 (collapsed) X, min(N, C) for orthogonal tokens of equal norm.
    """
    return effective_rank_of_spectrum(squared_singular_values(x))


def effective_rank_of_spectrum(s2: Tensor) -> Tensor:
    """``effective_rank`` from sigma_i^2 (..., K), as ``squared_singular_values`` returns them."""
    s = s2.sqrt()
    p = s / s.sum(-1, keepdim=True)
    return torch.exp(torch.special.entr(p).sum(-1))


@float64_no_autocast
def stable_rank(x: Tensor) -> Tensor:
    """||X||_F^2 / ||X||_2^2 = sum(s_i^2) / s_1^2 of uncentred X; 1 on collapse."""
    return stable_rank_of_spectrum(squared_singular_values(x))


def stable_rank_of_spectrum(s2: Tensor) -> Tensor:
    """``stable_rank`` from sigma_i^2 (..., K), descending."""
    return s2.sum(-1) / s2[..., 0]


@float64_no_autocast
def token_cosine(x: Tensor) -> Tensor:
    """Mean |cos| over pairs of distinct tokens (Gong et al. 2021, DiversePatch); 1 on collapse."""
    return token_cosine_of_gram(x @ x.transpose(-1, -2))


def token_cosine_of_gram(gram: Tensor) -> Tensor:
    """``token_cosine`` from the token Gram matrix X Xᵀ (..., N, N), so it can share the spectrum's."""
    n = gram.shape[-1]
    diagonal = gram.diagonal(dim1=-2, dim2=-1)
    # a zero token has cosine 0 with every other, as F.normalize gives; its eps (1e-12) would also
    # zero every token shorter than 1e-12, which a stack with small LayerScale produces
    inverse = 1 / diagonal.sqrt().clamp_min(torch.finfo(gram.dtype).tiny)
    # sum_ij |G_ij| / (|x_i| |x_j|) as a matrix-vector product: no (N, N) matrix of cosines
    every_pair = (gram.abs() @ inverse[..., None]).squeeze(-1).mul_(inverse).sum(-1)
    return (every_pair - (diagonal.abs() * inverse * inverse).sum(-1)) / (n * (n - 1))
