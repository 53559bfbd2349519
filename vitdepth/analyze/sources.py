"""What ``vitdepth analyze`` can open: a timm model, a Hugging Face encoder, or a vitdepth run.

Each source builds its model with the loaded weights (``build(None)``) or at a seeded random init
(``build(seed)``), applies Dong et al.'s surgery, makes its inputs and measures every layer.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from vitdepth.analyze import hf_models, inputs, timm_models
from vitdepth.analyze.weights import sha256_of
from vitdepth.errors import UsageError


class TimmSource:
    kind = "image"

    def __init__(
        self, name: str, pretrained: bool, checkpoint: str | None, model_kwargs: dict | None = None
    ) -> None:
        self.name, self.label = name, f"timm:{name}"
        self.pretrained, self.checkpoint = pretrained, checkpoint
        self.model_kwargs = model_kwargs or {}
        self.weights = "pretrained" if pretrained else "checkpoint" if checkpoint else None
        self.weight_files: list[Path] = [Path(checkpoint)] if checkpoint else []
        self._target: inputs.ImageTarget | None = None

    def build(self, seed: int | None) -> nn.Module:
        if seed is not None:
            torch.manual_seed(seed)
            model, _ = timm_models.create_timm(self.name, False, self.model_kwargs)
        else:
            model, file = timm_models.create_timm(self.name, self.pretrained, self.model_kwargs)
            if self.checkpoint:
                timm_models.load_checkpoint(model, self.checkpoint, self.label)
            self.weight_files = [file] if file else self.weight_files
        self._target = self._target or self._image_target(model)
        return model.eval()

    @staticmethod
    def _image_target(model: nn.Module) -> inputs.ImageTarget:
        from timm.data import resolve_data_config

        cfg = resolve_data_config({}, model=model)
        channels, _, size = cfg["input_size"]
        # the pretrained config keeps its input size when --model-kwargs set img_size; the patch
        # embedding has the grid the model was built for
        grid = getattr(getattr(model, "patch_embed", None), "img_size", None)
        size = grid[0] if grid else size
        return inputs.ImageTarget(size, channels, tuple(cfg["mean"]), tuple(cfg["std"]))

    def target(self) -> inputs.ImageTarget:
        return self._target  # set by the first build()

    def default_data(self) -> tuple[str, dict]:
        return "digits", {}

    def check(self, model: nn.Module, variant: str) -> None:
        timm_models.check_surgery(model, variant, self.label)

    def surgery(self, model: nn.Module, variant: str) -> nn.Module:
        return timm_models.surgery(model, variant, self.label)

    def measure(self, model: nn.Module, batch: dict) -> tuple[dict[str, torch.Tensor], int]:
        """Metrics name -> (layers + 1, B) and the number of prefix tokens they counted."""
        return timm_models.layer_metrics(model, batch["images"]), model.num_prefix_tokens


class RunSource(TimmSource):
    """A vitdepth run directory (its newest complete checkpoint) or one of its ``.ckpt`` files."""

    def __init__(self, path: str) -> None:
        from vitdepth.lit.run import newest_checkpoint

        path = Path(path)
        ckpt = newest_checkpoint(path) if path.is_dir() else path
        if ckpt is None or not ckpt.is_file():
            raise UsageError(
                f"{path} holds no complete checkpoint (checkpoints/last.ckpt); "
                "is it a vitdepth run?"
            )
        try:
            saved = torch.load(ckpt, map_location="cpu", weights_only=True)
        except Exception as error:  # noqa: BLE001 - a torn or foreign file is the user's to fix
            raise UsageError(
                f"cannot read Lightning checkpoint {ckpt}: {str(error).splitlines()[0]}"
            ) from error
        if "hyper_parameters" not in saved or "datamodule_hyper_parameters" not in saved:
            raise UsageError(
                f"{ckpt} is not a checkpoint of `vitdepth fit` (no saved hyperparameters); "
                "give a timm model with --checkpoint instead"
            )
        super().__init__(str(ckpt), pretrained=False, checkpoint=None)
        self.label, self.weights, self.weight_files = f"run:{ckpt}", "trained", [ckpt]
        # without LightningCLI's bookkeeping keys (``_instantiator``)
        self.hparams, self.data_hparams = (
            {k: v for k, v in saved[key].items() if not k.startswith("_")}
            for key in ("hyper_parameters", "datamodule_hyper_parameters")
        )

    def build(self, seed: int | None) -> nn.Module:
        from vitdepth.lit.classifier import ViTClassifier, load_model

        if seed is None:
            return load_model(str(self.weight_files[0])).eval()
        torch.manual_seed(seed)
        return ViTClassifier(**self.hparams).model.eval()

    def target(self) -> inputs.ImageTarget:
        from vitdepth.data.datamodules import ImageDataModule

        data = ImageDataModule(**self.data_hparams)
        return inputs.ImageTarget(self.hparams["img_size"], data.in_chans, data.mean, data.std)

    def default_data(self) -> tuple[str, dict]:
        return self.data_hparams["dataset"], dict(self.data_hparams)


class HFSource:
    def __init__(self, name: str, pretrained: bool, checkpoint: str | None) -> None:
        hf_models.require_transformers()
        self.name, self.label = name, f"hf:{name}"
        self.pretrained, self.checkpoint = pretrained, checkpoint
        self.weights = "pretrained" if pretrained else "checkpoint" if checkpoint else None
        self.weight_files: list[Path] = [Path(checkpoint)] if checkpoint else []
        self.loaded: hf_models.HFModel | None = None
        self.text_has_cls = False

    def build(self, seed: int | None) -> nn.Module:
        self.loaded = hf_models.load_hf(
            self.name,
            self.pretrained and seed is None,
            self.checkpoint if seed is None else None,
            seed,
        )
        if seed is None and self.pretrained:
            self.weight_files = self.loaded.weight_files
        return self.loaded.model

    @property
    def kind(self) -> str:
        return "text" if self._spec().image_size is None else "image"

    def _spec(self) -> hf_models.HFModel:
        return self.loaded  # set by the first build()

    def target(self) -> inputs.ImageTarget:
        spec = self._spec()
        return inputs.ImageTarget(spec.image_size, spec.in_chans, spec.mean, spec.std)

    def vocab_size(self) -> int:
        return self._spec().vocab_size

    def tokenizer(self):
        transformers = hf_models.require_transformers()
        try:
            return transformers.AutoTokenizer.from_pretrained(self.name, local_files_only=True)
        except (OSError, ValueError) as error:
            raise UsageError(
                f"hf:{self.name} has no tokenizer files here ({str(error).splitlines()[0]}); "
                "use --random-tokens N,LEN"
            ) from error

    def default_data(self) -> tuple[str, dict]:
        return "digits", {}

    def check(self, model: nn.Module, variant: str) -> None:
        from vitdepth.analyze.hf_surgery import check_surgery

        check_surgery(model.config.model_type, variant, self.label)

    def surgery(self, model: nn.Module, variant: str) -> nn.Module:
        from vitdepth.analyze.hf_surgery import dong_surgery

        return dong_surgery(model, variant, self.label)

    def measure(self, model: nn.Module, batch: dict) -> tuple[dict[str, torch.Tensor], int]:
        return hf_models.layer_metrics(model, batch, self._spec(), self.text_has_cls)


def open_source(model: str, pretrained: bool, checkpoint: str | None, model_kwargs: dict):
    """``timm:NAME``, ``hf:NAME_OR_DIR``, or a path to a vitdepth run directory or ``.ckpt``;
    ``model_kwargs`` (timm's ``--model-kwargs``) only for timm models."""
    scheme, _, name = model.partition(":")
    if scheme in ("timm", "hf") and not name:
        raise UsageError(
            f"model {model!r} names no model; e.g. timm:vit_base_patch16_224 or "
            "hf:bert-base-uncased"
        )
    if pretrained and checkpoint:
        raise UsageError("give either --pretrained or --checkpoint, not both")
    if model_kwargs and scheme != "timm":
        raise UsageError(
            f"--model-kwargs are keywords of timm.create_model; {model} is not a timm: model"
        )
    if scheme == "timm":
        return TimmSource(name, pretrained, checkpoint, model_kwargs)
    if scheme == "hf":
        return HFSource(name, pretrained, checkpoint)
    if Path(model).exists():
        if pretrained or checkpoint:
            raise UsageError(
                f"{model} is a vitdepth run: its checkpoint is the weights; "
                "drop --pretrained/--checkpoint"
            )
        return RunSource(model)
    raise UsageError(
        f"model {model!r}: expected timm:NAME, hf:NAME_OR_DIR, or a vitdepth run dir / .ckpt file "
        "that exists"
    )


def hashes(files: list[Path]) -> dict[str, str]:
    return {str(f): sha256_of(f) for f in files}
