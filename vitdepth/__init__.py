"""vitdepth: depth saturation and rank collapse in Vision Transformers."""

__version__ = "0.1.0"
