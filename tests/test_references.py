"""Docs and code cite papers or files of this repository, never notes that only the authors have."""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# the authors' private notes; written split so that this file does not match itself
PRIVATE = re.compile("|".join(re.escape(n + ".md") for n in ("science", "environment", "design", "ecosystem",
                                                              "style")) + "|" + re.escape("shared" + "/"))


def test_no_file_points_to_private_notes():
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    hits = []
    for name in files:
        path = REPO / name
        if path.suffix in (".png", ".ckpt", ".pt") or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if PRIVATE.search(line):
                hits.append(f"{name}:{number}: {line.strip()[:80]}")
    assert not hits, "\n".join(hits)
