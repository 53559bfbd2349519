"""How to cite: CITATION.cff is valid CFF 1.2.0 and names this version; results/README.md indexes
every results folder."""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import jsonschema
import yaml

REPO = Path(__file__).resolve().parents[1]
# The official CFF 1.2.0 schema (https://citation-file-format.github.io/1.2.0/schema.json), as shipped
# in cffconvert 2.0.0 (cffconvert/schemas/1.2.0/schema.json); cffconvert itself pins jsonschema < 4.
SCHEMA = json.loads((Path(__file__).parent / "cff-1.2.0.schema.json").read_text())


def cff_errors(citation: dict) -> list[str]:
    validator = jsonschema.Draft7Validator(SCHEMA, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(citation)]


def test_citation_cff_is_valid_and_names_this_version():
    citation = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert cff_errors(citation) == []
    version = re.search(r'^version = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.MULTILINE)
    assert citation["version"] == version.group(1)
    (paper,) = [r for r in citation["references"] if "2103.03404" in r["url"]]
    assert [a["family-names"] for a in paper["authors"]] == ["Dong", "Cordonnier", "Loukas"]

    broken = copy.deepcopy(citation)
    del broken["authors"]
    broken["references"][0]["type"] = "paper"  # not one of CFF's reference types
    assert len(cff_errors(broken)) == 2  # the schema check can fail


def test_results_readme_lists_every_results_folder():
    index = (REPO / "results" / "README.md").read_text()
    listed = set(re.findall(r"^\| `([\w.-]+)/`", index, flags=re.MULTILINE))
    folders = {p.name for p in (REPO / "results").iterdir() if p.is_dir()}
    assert folders - listed == set(), "add a row for each to results/README.md"
    assert listed - folders == set(), "rows of results/README.md without a folder"




def committed_run_folders() -> list[Path]:
    return sorted(p.parent for p in (REPO / "results").glob("*/runs") if p.is_dir())


def test_a_results_folder_with_its_run_directories_is_their_report(tmp_path):
    """A results folder that ships its run directories (``runs/``, checkpoints left out) holds the
    report of exactly those runs: ``vitdepth report <folder>/runs`` rebuilds its summary.csv and
    summary.md byte for byte, so no table can outlive or outgrow the runs behind it."""
    from vitdepth.report import build_report

    folders = committed_run_folders()
    assert REPO / "results" / "fashionmnist-depth" in folders
    for folder in folders:
        if (folder / "predictions.csv").is_file():  # the report scores the folder's pre-registration
            (tmp_path / folder.name).mkdir()
            shutil.copy(folder / "predictions.csv", tmp_path / folder.name)
        build_report([folder / "runs"], tmp_path / folder.name)
        for name in ("summary.csv", "summary.md", "runs.csv"):
            rebuilt = (tmp_path / folder.name / name).read_text()
            assert rebuilt == (folder / name).read_text(), f"{folder.name}/{name}: rerun the report"


def test_summary_tables_rebuild_from_the_per_run_file_alone():
    """runs.csv, the one file a citation needs, holds every number summary.md's tables show."""
    from vitdepth.report import summary_markdown
    from vitdepth.report.runs_table import runs_from_csv

    for folder in committed_run_folders():
        runs = runs_from_csv(folder / "runs.csv")
        rebuilt = summary_markdown(runs, 0.5, folder / "predictions.csv")
        assert rebuilt == (folder / "summary.md").read_text(), folder.name
