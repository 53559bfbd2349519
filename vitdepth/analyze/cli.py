"""``vitdepth analyze MODEL``: per-layer rank collapse of a timm model, a Hugging Face encoder or a
vitdepth run, with Dong et al.'s surgery; writes analysis.csv, analysis.png and provenance.json."""

from __future__ import annotations

import argparse
from pathlib import Path

from vitdepth.collapse.cli import int_list


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "analyze",
        help="rank collapse per layer of any timm / HF model or vitdepth run",
        description=__doc__,
    )
    p.add_argument(
        "model",
        metavar="MODEL",
        help="timm:NAME, hf:NAME_OR_DIR (a Hub id in the local cache or a save_pretrained folder), "
        "or a vitdepth run directory / Lightning .ckpt",
    )
    weights = p.add_mutually_exclusive_group()
    weights.add_argument(
        "--pretrained", action="store_true", help="timm/HF weights from the local cache"
    )
    weights.add_argument(
        "--checkpoint", help=".safetensors, .pth/.pt state dict, or a Lightning .ckpt"
    )
    p.add_argument(
        "--model-kwargs",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="timm: models: keywords for timm.create_model, as timm's train.py takes them "
        "(e.g. img_size=224: a checkpoint's position embeddings are resampled to it)",
    )
    p.add_argument(
        "--with-init",
        action="store_true",
        help="also measure random inits (--seeds) beside the loaded weights",
    )
    p.add_argument(
        "--variants", default="full", help="comma-separated from full,skip,mlp,pure (Dong et al.)"
    )
    p.add_argument("--seeds", type=int_list, default=[0], help="random-init draws (default 0)")
    p.add_argument(
        "--data", help="a vitdepth dataset (digits, mnist5k, cifar10, ...), resized to the model"
    )
    p.add_argument("--data-root", help="folder of cifar10/cifar100/imagenet files for --data")
    p.add_argument("--images", help="a folder of image files")
    p.add_argument("--text", help="text encoders: a file with one sequence a line")
    p.add_argument(
        "--random-tokens",
        metavar="N,LEN",
        help="text encoders: N seeded uniform sequences of LEN ids",
    )
    p.add_argument(
        "--n-inputs", type=int, default=32, help="images or text lines (default 32, as Dong et al.)"
    )
    p.add_argument("--max-length", type=int, default=128, help="tokens per --text line at most")
    p.add_argument(
        "--dtype", default="float32", choices=("float32", "float64"), help="forward precision"
    )
    p.add_argument("--out", type=Path, required=True)
    return p


def run(args: argparse.Namespace) -> int:
    from vitdepth.analyze import analyze
    from vitdepth.analyze.timm_models import parse_model_kwargs

    result = analyze(
        args.model,
        variants=[v.strip() for v in args.variants.split(",") if v.strip()],
        pretrained=args.pretrained,
        checkpoint=args.checkpoint,
        model_kwargs=parse_model_kwargs(args.model_kwargs),
        seeds=args.seeds,
        with_init=args.with_init,
        data=args.data,
        data_root=args.data_root,
        images=args.images,
        text=args.text,
        random_tokens=args.random_tokens,
        n_inputs=args.n_inputs,
        max_length=args.max_length,
        dtype=args.dtype,
    )
    paths = result.write(args.out)
    print(f"wrote {', '.join(p.name for p in paths)} to {args.out} ({result.provenance['inputs']})")
    return 0
