from vitdepth.lit.classifier import ViTClassifier, load_model

__all__ = ["ViTClassifier", "load_model"]
