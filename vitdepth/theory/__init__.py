"""Checks of the theory behind rank collapse: Dong et al.'s bound, its proof's gaps, path lengths."""

from vitdepth.theory.bound import bound_rows, head_matrices, layer_beta, lemma_a1_counterexample, logit_spread
from vitdepth.theory.paths import path_accuracy, path_terms

__all__ = ["bound_rows", "head_matrices", "layer_beta", "lemma_a1_counterexample", "logit_spread",
           "path_accuracy", "path_terms"]
