"""``vitdepth theory``: Dong et al.'s bound layer by layer, its missing assumption, and path lengths.

    vitdepth theory --init pure:6 --out results/theory
    vitdepth theory --run runs/<group>/<run_id> --out results/theory

Writes bound.csv (one row per model, stage and layer), counterexample.csv, paths.csv (runs of an
attention + skip variant without MLP), PNGs and summary.md. Formulas: Dong, Cordonnier & Loukas
2021 (arXiv:2103.03404), §2, and the docstrings of ``vitdepth.theory.bound`` and ``paths``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from vitdepth.collapse.cli import provenance, to_csv
from vitdepth.collapse.measure import add_model_shape_args, load_inputs
from vitdepth.errors import UsageError
from vitdepth.models import VARIANTS, build_vit
from vitdepth.rundir import atomic_write_json, atomic_write_text
from vitdepth.theory.bound import BOUND_COLUMNS, bound_rows, lemma_a1_counterexample
from vitdepth.theory.paths import PATH_COLUMNS, check_path_model, path_accuracy
from vitdepth.theory.plot import plot_bound, plot_paths, plot_spread
from vitdepth.theory.runs import first_images, load_run
from vitdepth.theory.summary import summary_markdown


def variant_depth(text: str) -> tuple[str, int]:
    variant, _, depth = text.partition(":")
    if variant not in VARIANTS or not depth.isdigit() or int(depth) < 1:
        raise argparse.ArgumentTypeError(f"expected VARIANT:DEPTH with VARIANT one of {', '.join(VARIANTS)} "
                                         f"and DEPTH >= 1, got {text!r}")
    return variant, int(depth)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("theory", help="Dong et al.'s bound, its missing assumption, path lengths",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", dest="runs", type=Path, action="append", default=[],
                   help="a run directory with checkpoints/last.ckpt (repeatable): its init and trained model")
    p.add_argument("--init", type=variant_depth, action="append", default=[], metavar="VARIANT:DEPTH",
                   help="a freshly initialised model (repeatable); shaped by the flags below")
    p.add_argument("--n-images", type=int, default=32, help="images per bound/spread probe")
    p.add_argument("--seed", type=int, default=None, help="init seed (default 0; for --run, run.json's seed)")
    g = p.add_argument_group("--init models")
    add_model_shape_args(g)
    p.add_argument("--out", type=Path, required=True)
    return p


def run(args: argparse.Namespace) -> int:
    if not args.runs and not args.init:
        raise UsageError("theory needs at least one --run RUN_DIR or --init VARIANT:DEPTH")
    if args.n_images < 1:
        raise UsageError(f"--n-images must be >= 1, got {args.n_images}")
    bound, paths, errors = [], [], {}
    if args.init:
        images = load_inputs(args.data, args.n_images, args.img_size)
    for variant, depth in args.init:
        torch.manual_seed(0 if args.seed is None else args.seed)
        model = build_vit(variant, depth, embed_dim=args.embed_dim, num_heads=args.num_heads,
                          patch_size=args.patch_size, img_size=args.img_size, in_chans=images.shape[1],
                          num_classes=10, norm=not args.no_norm, weight_init=args.weight_init)
        bound += bound_rows(model, images, f"{variant}:{depth}", "init")
        print(f"bound: {variant}:{depth} at init")
    for run_dir in args.runs:
        loaded = load_run(run_dir, args.seed)
        images = first_images(loaded.val_loader, args.n_images)
        bound += bound_rows(loaded.init, images, loaded.name, "init")
        bound += bound_rows(loaded.trained, images, loaded.name, "trained")
        print(f"bound: {loaded.name} at init and trained")
        try:
            check_path_model(loaded.trained)
        except UsageError as reason:
            print(f"paths: skipping {loaded.name}: {reason}")
            continue
        rows, errors[loaded.name] = path_accuracy(loaded.trained, loaded.val_loader, loaded.name)
        paths += rows
        print(f"paths: {loaded.name}, reproduction error {errors[loaded.name]:.1e}")

    counter = lemma_a1_counterexample()
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "bound.csv", to_csv(bound, BOUND_COLUMNS))
    atomic_write_text(args.out / "counterexample.csv", to_csv([counter], ("lhs", "rhs", "holds")))
    plot_bound(bound, args.out / "bound.png")
    plot_spread(bound, args.out / "spread.png")
    written = ["bound.csv", "counterexample.csv", "bound.png", "spread.png"]
    if paths:
        atomic_write_text(args.out / "paths.csv", to_csv(paths, PATH_COLUMNS))
        plot_paths(paths, args.out / "paths.png")
        written += ["paths.csv", "paths.png"]
    atomic_write_text(args.out / "summary.md", summary_markdown(bound, counter, paths, errors))
    atomic_write_json(args.out / "provenance.json", provenance(args))
    print(f"wrote {args.out}/{', '.join(written)}, summary.md")
    print(f"Lemma A.1 Eqn (12): ||D 1 softmax(r)^T R W_V||_1 = {counter['lhs']:g} vs "
          f"||D 1||_inf ||R||_1 ||W_V||_1 = {counter['rhs']:g}")
    return 0
