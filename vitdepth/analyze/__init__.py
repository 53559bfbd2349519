"""``vitdepth analyze``: layer-wise rank collapse of a timm model, a Hugging Face encoder or a
vitdepth run, with Dong et al.'s surgery (full, skip, mlp, pure) applied to its loaded weights.

    from vitdepth.analyze import analyze
    result = analyze("hf:bert-base-uncased", pretrained=True, random_tokens="32,128",
                     variants=("full", "skip", "mlp", "pure"))
    result.write("results/bert")   # analysis.csv, analysis.png, provenance.json
"""

from vitdepth.analyze.core import METRICS, Analysis, analyze

__all__ = ["METRICS", "Analysis", "analyze"]
