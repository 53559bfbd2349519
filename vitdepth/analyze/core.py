"""The analysis: every (weights, seed, variant) pass over one fixed input batch, as a table."""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from vitdepth.analyze import inputs as inputs_
from vitdepth.analyze.sources import hashes, open_source
from vitdepth.analyze.timm_models import SURGERY_VARIANTS
from vitdepth.errors import UsageError
from vitdepth.rundir import LAYER_METRICS, VANISHED, tokens_vanished

METRICS = (*LAYER_METRICS, "attn_similarity")
DTYPES = {"float32": torch.float32, "float64": torch.float64}
ID_COLUMNS = ("model", "weights", "seeds", "variant", "layer", "n_inputs", "num_prefix_tokens")
# How many (seed, input) passes of a layer had their tokens vanish, and what that means.
VANISHED_COLUMNS = ("tokens_vanished", "note")


@dataclass
class Analysis:
    """Per-layer statistics (``rows``, the columns of analysis.csv) and where they came from."""

    rows: list[dict]
    provenance: dict
    values: dict = field(
        repr=False, default_factory=dict
    )  # (weights, variant) -> [per-seed metric dicts]

    @property
    def columns(self) -> tuple[str, ...]:
        return (*ID_COLUMNS, *(f"{m}_{s}" for m in METRICS for s in ("mean", "std", "seed_std")),
                *VANISHED_COLUMNS)

    def write(self, out: str | Path) -> list[Path]:
        """analysis.csv, analysis.png and provenance.json in ``out`` (created if missing)."""
        from vitdepth.analyze.plot import analysis_png
        from vitdepth.collapse.cli import to_csv
        from vitdepth.rundir import atomic_write_bytes, atomic_write_json, atomic_write_text

        out = Path(out)
        paths = [out / "analysis.csv", out / "analysis.png", out / "provenance.json"]
        atomic_write_text(paths[0], to_csv(self.rows, self.columns))
        atomic_write_bytes(paths[1], analysis_png(self.rows, self.provenance))
        atomic_write_json(paths[2], self.provenance)
        return paths


def analyze(
    model: str,
    *,
    variants=("full",),
    pretrained: bool = False,
    checkpoint: str | None = None,
    model_kwargs: dict | None = None,
    seeds=(0,),
    with_init: bool = False,
    data: str | None = None,
    data_root: str | None = None,
    images: str | None = None,
    text: str | None = None,
    random_tokens: str | None = None,
    n_inputs: int = 32,
    max_length: int = 128,
    dtype: str = "float32",
    log=print,
) -> Analysis:
    """Measure every layer of ``model`` (see ``vitdepth analyze -h`` for the arguments).

    Random init (no ``pretrained``/``checkpoint``, or ``with_init``) draws a model per seed; loaded
    weights are measured once. The same inputs feed every pass.
    """
    variants = tuple(variants)
    for variant in variants:
        if variant not in SURGERY_VARIANTS:
            raise UsageError(
                f"unknown variant {variant!r}; choose from {', '.join(SURGERY_VARIANTS)}"
            )
    if dtype not in DTYPES:
        raise UsageError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    if n_inputs < 1 or not seeds:
        raise UsageError("need at least one input (--n-inputs >= 1) and one seed")
    source = open_source(model, pretrained, checkpoint, model_kwargs or {})
    if with_init and source.weights is None:
        raise UsageError(
            "--with-init compares loaded weights with init: give --pretrained, --checkpoint "
            "or a run"
        )
    passes = (
        [("init", s) for s in seeds]
        if source.weights is None
        else [(source.weights, None), *(("init", s) for s in seeds if with_init)]
    )
    first = source.build(passes[0][1])  # also tells the source its input size and normalisation
    for variant in variants:  # an unsupported (model, variant) fails now, not after work is done
        source.check(first, variant)
    batch, described = _inputs(
        source, data, data_root, images, text, random_tokens, n_inputs, max_length
    )
    batch = {k: v.to(DTYPES[dtype]) if v.is_floating_point() else v for k, v in batch.items()}

    values: dict[tuple[str, str], list[dict]] = {}
    prefix = None
    for index, (weights, seed) in enumerate(passes):
        base = (first if index == 0 else source.build(seed)).to(DTYPES[dtype])
        for variant in variants:
            start = time.perf_counter()
            metrics, prefix = source.measure(source.surgery(base, variant), batch)
            values.setdefault((weights, variant), []).append(
                {k: v.numpy() for k, v in metrics.items()}
            )
            log(
                f"analyze: {weights}{'' if seed is None else f' seed {seed}'} {variant}: "
                f"{time.perf_counter() - start:.1f} s"
            )
    n = next(iter(batch.values())).shape[0]
    rows = _rows(source.label, values, passes, n, prefix, dtype)
    provenance = _provenance(source, passes, variants, described, n, prefix, dtype)
    return Analysis(rows, provenance, values)


def _inputs(
    source, data, data_root, images, text, random_tokens, n, max_length
) -> tuple[dict, str]:
    given = [
        flag
        for flag, value in (
            ("--data", data),
            ("--images", images),
            ("--text", text),
            ("--random-tokens", random_tokens),
        )
        if value
    ]
    if len(given) > 1:
        raise UsageError(f"give one input source, not {' and '.join(given)}")
    if source.kind == "text":
        if data or images:
            raise UsageError(
                f"{source.label} is a text encoder: give --text FILE or --random-tokens N,LEN"
            )
        if random_tokens:
            ids, described = inputs_.random_tokens(random_tokens, source.vocab_size())
        elif text:
            ids, described = inputs_.text_tokens(text, source.tokenizer(), n, max_length)
            source.text_has_cls = True
        else:
            raise UsageError(
                f"{source.label} is a text encoder: give --text FILE or --random-tokens N,LEN"
            )
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, described
    if text or random_tokens:
        raise UsageError(f"{source.label} takes images: give --data NAME or --images DIR")
    target = source.target()
    if images:
        pixels, described = inputs_.folder_images(images, n, target)
    else:
        default, kwargs = source.default_data()
        name = data or default
        kwargs = {k: v for k, v in kwargs.items() if k != "dataset"} if name == default else {}
        if data_root:
            kwargs["root"] = data_root
        pixels, described = inputs_.data_module_images(name, n, target, **kwargs)
    key = "images" if source.label.startswith(("timm:", "run:")) else "pixel_values"
    return {key: pixels}, described


def _rows(label: str, values: dict, passes: list, n: int, prefix: int | None,
          dtype: str) -> list[dict]:
    """One row per (weights, variant, layer): mean over seeds and inputs, std over inputs (root mean
    square of the per-seed stds), and std over seeds of the per-seed means (ddof 1; NaN for one
    seed). Inputs whose tokens vanished have no scale-free metrics: the means are over the others
    and ``note`` says how many vanished (all of them: the metric is undefined, not 0)."""
    rows = []
    for (weights, variant), per_seed in values.items():
        seeds = [s for w, s in passes if w == weights and s is not None]
        for layer in range(per_seed[0]["rel_residual"].shape[0]):
            row = {
                "model": label,
                "weights": weights,
                "seeds": ";".join(map(str, seeds)),
                "variant": variant,
                "layer": layer,
                "n_inputs": n,
                "num_prefix_tokens": prefix,
            }
            for metric in METRICS:
                stack = np.stack([seed[metric][layer] for seed in per_seed])  # (seeds, inputs)
                with warnings.catch_warnings():
                    warnings.simplefilter(
                        "ignore", RuntimeWarning
                    )  # all-NaN layers (no attention map)
                    row[f"{metric}_mean"] = float(np.nanmean(stack))
                    row[f"{metric}_std"] = float(np.sqrt(np.nanmean(np.nanvar(stack, axis=1))))
                    means = np.nanmean(stack, axis=1)
                    row[f"{metric}_seed_std"] = (
                        float(np.std(means, ddof=1)) if len(means) > 1 else float("nan")
                    )
            norms = np.concatenate([seed["token_norm"][layer] for seed in per_seed])
            vanished = int(sum(tokens_vanished(v, dtype) for v in norms))
            row["tokens_vanished"] = vanished
            row["note"] = _note(row, vanished, len(norms), dtype)
            rows.append(row)
    return rows


def _note(row: dict, vanished: int, passes: int, dtype: str) -> str:
    """Why a layer's numbers are undefined or exactly 0, so no reader takes either for a result."""
    if vanished:
        others = " (means over the others)" if vanished < passes else ""
        return f"{VANISHED} in {vanished} of {passes} passes: scale-free metrics undefined{others}"
    if row["rel_residual_mean"] == 0.0:  # e.g. softmax of logits below rounding: uniform attention
        return f"tokens identical to {dtype} precision in every pass: exact token uniformity"
    return ""


def _provenance(source, passes, variants, described, n, prefix, dtype) -> dict:
    import shlex
    import sys
    from datetime import datetime, timezone
    from importlib import metadata

    from vitdepth.provenance import git_state, hardware, library_versions

    versions = library_versions()
    for extra in ("transformers", "safetensors"):
        try:
            versions[extra] = metadata.version(extra)
        except metadata.PackageNotFoundError:
            versions[extra] = None
    return {
        "command": shlex.join(["vitdepth", *sys.argv[1:]]),
        "model": source.label,
        "weights": sorted({w for w, _ in passes}),
        "seeds": [s for _, s in passes if s is not None],
        "weight_files_sha256": hashes(source.weight_files),
        "variants": list(variants),
        "inputs": described,
        "n_inputs": n,
        "num_prefix_tokens": prefix,
        "dtype": dtype,
        "eval_mode": True,
        "git": git_state(),
        "versions": versions,
        "hardware": hardware(),
        "written_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
