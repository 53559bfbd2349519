"""`vitdepth bench --quick` end to end: every file and every key (speed is the benchmark's job, not a test's)."""

import json

import pytest
import torch

from vitdepth.bench.core import make_plan
from vitdepth.bench.report import SECTIONS, figures, write_report
from vitdepth.cli import main

CPU, GPU = make_plan("cpu", quick=True), make_plan("cuda", quick=True)


@pytest.fixture(scope="module")
def quick_bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    assert main(["bench", "--quick", "--out", str(out)]) == 0
    return out


def test_quick_bench_writes_every_file(quick_bench):
    for name in ("bench.json", "bench.md", "scaling.png"):
        assert (quick_bench / name).stat().st_size > 0, name
    assert (quick_bench / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_quick_bench_json_has_every_figure_and_its_provenance(quick_bench):
    doc = json.loads((quick_bench / "bench.json").read_text())
    assert set(doc["figures"]) == {f.name for f in figures(CPU)}  # CPU run: no GPU figures
    for name, figure in doc["figures"].items():
        assert isinstance(figure["value"], float), name
        judged = figure["op"] is not None and not doc["busy"] and not figure["error"]
        assert figure["pass"] in (True, False, None) and (figure["pass"] is not None) == judged, name
    assert doc["threads"] == 1 and doc["quick"] is True and doc["device"] == "cpu"
    assert doc["command"].startswith("vitdepth bench --device cpu --quick")
    assert {"hardware", "versions", "git", "glibc_tunables", "load_start", "busy_cores_start",
            "busy", "plan"} <= set(doc)
    results = doc["results"]
    assert {"lightning", "bare", "timm"} <= set(results["a"]["images_per_s"])
    assert results["a"]["step_overhead_ms"] is not None and results["a"]["lightning_floor_ms"]
    assert len(results["b"]["probe_seconds"]) >= 1  # the callback probed during a's fit
    assert len(results["b"]["probes_at_c"]["blocking_s"]) >= 2
    assert {"depth", "tokens", "batch"} <= set(results["c"]["scaling"])
    assert {"digits", "mnist5k", "synthetic", "cifar10"} <= set(results["d"]["loaders"])
    assert results["e"]["flops_per_step"] > 0


def test_quick_bench_markdown_lists_every_figure_with_its_target(quick_bench):
    text = (quick_bench / "bench.md").read_text()
    verdicts = {name: f["verdict"] for name, f in
                json.loads((quick_bench / "bench.json").read_text())["figures"].items()}
    shown = {"PASS": "PASS", "MISS": "MISS", "NOT JUDGED": "not judged (busy)", "ERROR": "ERROR"}
    for figure in figures(CPU):
        row = next(line for line in text.splitlines() if line.startswith(f"| `{figure.name}` |"))
        if figure.op:
            assert f"{figure.op} {figure.target:.3g}" in row, row
            assert shown[verdicts[figure.name]] in row, row
    for section in SECTIONS:
        assert f"## {section.key}. {section.title}" in text
    missed = text.split("## Missed targets")[1]
    for name, f in json.loads((quick_bench / "bench.json").read_text())["figures"].items():
        assert (f"- `{name}` =" in missed) == (f["met"] is False), name
    assert "Not run: this was a CPU benchmark" in text
    assert "Quick mode" in text and "GLIBC_TUNABLES" in text and "vitdepth bench --device cpu --quick" in text


def test_cuda_without_a_gpu_is_a_one_line_usage_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "--device", "cuda", "--quick", "--out", str(tmp_path / "gpu")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--device cuda" in err
    assert not (tmp_path / "gpu").exists()


def test_every_figure_is_registered_once_and_every_target_has_a_cause():
    names = [f.name for f in figures(GPU)]
    assert len(names) == len(set(names)) and set(names) - {f.name for f in figures(CPU)} == {
        "mfu_bf16_eager", "mfu_bf16_compile"}
    for section in SECTIONS:
        for figure in section.figures:
            assert (figure.op is None) == (figure.target is None), figure.name
            if figure.op:
                assert figure.cause, figure.name


def meta_of(doc: dict, **changes) -> dict:
    return {**{k: v for k, v in doc.items() if k not in ("plan", "figures", "results")}, **changes}


def test_gpu_section_reports_its_figures_from_results(quick_bench, tmp_path):
    """What --device cuda writes, from stand-in results (no GPU here): f's table and figures."""
    doc = json.loads((quick_bench / "bench.json").read_text())
    results = {**doc["results"], "f": {
        "gpu": "stand-in", "precision": "bf16-mixed",
        "compiled_images_per_s": {"lightning": 1e4, "bare": 2e4},
        "compiled_timings": {}, "mfu_bf16_eager": 0.2, "mfu_bf16_eager_bare": 0.25,
        "mfu_bf16_compile": 0.5, "mfu_bf16_compile_bare": 0.55}}
    write_report(tmp_path, results, GPU, meta_of(doc, busy_cores_start=0.0, busy_cores_end=0.0))
    written = json.loads((tmp_path / "bench.json").read_text())
    assert set(written["figures"]) == {f.name for f in figures(GPU)}
    assert written["figures"]["mfu_bf16_compile"]["pass"] is True
    text = (tmp_path / "bench.md").read_text()
    assert "## f. GPU: bf16-mixed, torch.compile" in text
    assert "| ours (Lightning) | 0.200 | 0.500 |" in text
    assert "Not run" not in text


def test_a_failed_section_is_reported_and_the_rest_still_written(quick_bench, tmp_path):
    doc = json.loads((quick_bench / "bench.json").read_text())
    results = {k: v for k, v in doc["results"].items() if k != "c"}
    results["errors"] = {"c": "RuntimeError: boom"}
    write_report(tmp_path, results, CPU, meta_of(doc))
    written = json.loads((tmp_path / "bench.json").read_text())
    assert written["figures"]["metrics_s_d12_b256"]["value"] is None
    assert written["figures"]["ours_over_bare"]["value"] == doc["figures"]["ours_over_bare"]["value"]
    text = (tmp_path / "bench.md").read_text()
    assert "RuntimeError: boom" in text and "**ERROR**" in text
    assert (tmp_path / "scaling.png").stat().st_size > 0


def test_a_fraction_of_a_peak_above_one_is_an_error_never_a_pass(quick_bench, tmp_path):
    doc = json.loads((quick_bench / "bench.json").read_text())
    results = {**doc["results"], "e": {**doc["results"]["e"], "flop_fraction": 1.24}}
    write_report(tmp_path, results, CPU, meta_of(doc, busy_cores_start=0.0, busy_cores_end=0.0))
    written = json.loads((tmp_path / "bench.json").read_text())
    figure = written["figures"]["flop_fraction"]
    assert figure["verdict"] == "ERROR" and figure["pass"] is None and "above 1" in figure["error"]
    assert written["figures"]["ours_over_bare"]["verdict"] in ("PASS", "MISS")  # idle: judged
    row = next(line for line in (tmp_path / "bench.md").read_text().splitlines()
               if line.startswith("| `flop_fraction` |"))
    assert "**ERROR**" in row and "PASS" not in row


def test_a_busy_machine_marks_no_figure_pass_or_miss(quick_bench, tmp_path):
    doc = json.loads((quick_bench / "bench.json").read_text())
    cores = doc["hardware"]["cpu_count"]
    write_report(tmp_path, doc["results"], CPU,
                 meta_of(doc, busy_cores_start=0.6 * cores, busy_cores_end=0.0))
    written = json.loads((tmp_path / "bench.json").read_text())
    assert written["busy"] is True
    assert {f["verdict"] for f in written["figures"].values()} <= {"NOT JUDGED", "ERROR", "—"}
    text = (tmp_path / "bench.md").read_text()
    assert "**Busy machine**" in text and "| PASS |" not in text and "**MISS**" not in text


def test_the_spectrum_floor_times_the_very_eigenvalues_the_metrics_rank():
    """``metrics_spectrum_s`` is a floor only if it computes what the ranks are made of."""
    from vitdepth.bench.metric_cost import SpectrumMeter, metrics_workload
    from vitdepth.metrics import effective_rank_of_spectrum, stable_rank_of_spectrum

    metrics, _, _ = metrics_workload(CPU.metrics, torch.device("cpu"))
    every, spectra = metrics(), metrics(SpectrumMeter)
    assert spectra["sigma2"].shape[:2] == every["effective_rank"].shape  # (layers, images)
    assert torch.equal(effective_rank_of_spectrum(spectra["sigma2"]), every["effective_rank"])
    assert torch.equal(stable_rank_of_spectrum(spectra["sigma2"]), every["stable_rank"])
