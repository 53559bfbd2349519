"""W&B as a view of the run directory: ``vitdepth wandb-sync`` builds one offline W&B run per run
directory, whatever the number of starts, and uploads only what changed. The ``.wandb`` files are
read back with ``wandb_records`` (wandb 0.31 ships no reader)."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import socket
import threading
import time
from pathlib import Path

import pytest
from rundir_factory import write_run
from test_faults import fit_args, killed_at, vitdepth
from wandb_records import read_run

from vitdepth.cli import main
from vitdepth.lit.cli import resolve_run
from vitdepth.rundir import read_json, read_status

pytestmark = pytest.mark.usefixtures("no_wandb_settings")

# metrics.csv column -> W&B key: per-layer scalars in their own section, one step axis
EXPECTED_RENAMES = {"epoch": "trainer/epoch", "step": "trainer/global_step", "lr": "train/lr"}


def expected_key(column: str) -> str:
    per_layer = re.fullmatch(r"rank/(\w+)/(L\d\d)", column)
    return (
        f"rank_layers/{per_layer[1]}/{per_layer[2]}"
        if per_layer
        else EXPECTED_RENAMES.get(column, column)
    )


def cell(text: str):
    """A CSV cell as it should reach W&B: int, float, or text (the probe_dtype column)."""
    if text == "":
        return None
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def same_row(got: dict, want: dict) -> bool:
    return got.keys() == want.keys() and all(same(got[k], want[k]) for k in want)


def csv_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def table(folder: Path, ref: dict) -> dict:
    return json.loads((folder / "files" / ref["path"]).read_text())


def view_folder(run: Path) -> Path:
    (folder,) = (run / "wandb-view" / "wandb").glob("offline-run-*")
    return folder


def metrics_rows(history: list[dict]) -> list[dict]:
    return [
        {k: v for k, v in row.items() if k != "_step"}
        for row in history
        if "rank_layers/table" not in row
    ]


# 1. one W&B run per run directory ----------------------------------------------------------------


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    """Three real starts: SIGKILLed in epoch 1's validation, resumed and SIGKILLed in epoch 2's,
    resumed to the end (the last start logging to W&B offline, as on a compute node); then ``wandb-sync
    --dry-run``. Returns the run directory."""
    root = tmp_path_factory.mktemp("resumed")
    with pytest.MonkeyPatch.context() as env:
        for key in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_SERVICE"):
            env.delenv(key, raising=False)
        env.setenv("VITDEPTH_CACHE", str(root / "cache"))
        args = fit_args(root / "runs")
        run = resolve_run(args).dir
        killed_at("validation", 12, args)  # start 1: 2 sanity + 6 in epoch 0, dies in epoch 1
        second = killed_at(
            "validation", 12, args
        )  # start 2 resumes after epoch 0, dies in epoch 2
        assert "resuming" in second.stderr
        third = vitdepth(*fit_args(root / "runs", wandb="offline"))
        assert third.returncode == 0 and "resuming" in third.stderr, third.stderr[-2000:]
        assert main(["wandb-sync", str(root / "runs"), "--dry-run", "--project", "vd-test"]) == 0
    return run


def test_a_run_resumed_twice_becomes_one_wandb_run_with_every_row_once(resumed_run):
    """The offline run that ``wandb-sync --dry-run`` builds holds metrics.csv and layers.csv row
    for row, in step order, with the run's config, summary and outcome."""
    run = resumed_run
    assert read_status(run)["status"] == "finished"
    folder = view_folder(run)
    got = read_run(folder)

    rows = csv_rows(run / "metrics.csv")
    in_step_order = sorted(rows, key=lambda r: int(r["step"]))  # stable: file order within a step
    want = [{expected_key(k): cell(v) for k, v in r.items() if v != ""} for r in in_step_order]
    history = metrics_rows(got.history)
    assert len(history) == len(want) and all(map(same_row, history, want))
    assert [r["trainer/epoch"] for r in history if "val/acc1" in r] == [0, 1, 2]  # each epoch once
    assert [r["_step"] for r in got.history] == list(range(len(got.history)))

    layers = csv_rows(run / "layers.csv")
    probes = [r for r in got.history if "rank_layers/table" in r]
    assert [(p["trainer/epoch"], p["trainer/global_step"]) for p in probes] == sorted(
        {(int(r["epoch"]), int(r["step"])) for r in layers}, key=lambda p: p[1]
    )
    assert [p["trainer/epoch"] for p in probes] == [-1, 0, 1, 2]
    read_back = [row for p in probes for row in table(folder, p["rank_layers/table"])["data"]]
    columns = table(folder, probes[0]["rank_layers/table"])["columns"]
    assert columns == list(layers[0])
    assert len(read_back) == len(layers) and all(
        all(same(got_v, cell(r[c])) for got_v, c in zip(row, columns))
        for row, r in zip(read_back, layers)
    )
    steps = [r["trainer/global_step"] for r in got.history]
    assert steps == sorted(steps)

    facts = read_json(run / "run.json")
    assert {k: got.config[k] for k in ("depth", "variant", "dataset", "seed")} == {
        "depth": 2,
        "variant": "full",
        "dataset": "digits",
        "seed": 0,
    }
    assert got.config["run_id"] == facts["run_id"] and got.config["lr"] > 0
    assert (
        got.run.run_id,
        got.run.run_group,
        got.run.display_name,
        list(got.run.tags),
        got.run.project,
    ) == (run.name, facts["group"], "full-d2-s0", ["full", "digits", "d2"], "vd-test")
    status = read_status(run)
    assert {k: got.summary[f"run/{k}"] for k in status} == status
    assert got.summary["val/acc1"] == [r for r in history if "val/acc1" in r][-1]["val/acc1"]
    final = table(folder, got.summary["final/run"])
    assert final["columns"][:4] == ["run_id", "group", "variant", "depth"]
    assert final["data"] == [
        [
            run.name,
            facts["group"],
            "full",
            2,
            0,
            "digits",
            "finished",
            got.summary["val/acc1"],
            got.summary["rank/rel_residual/last"],
        ]
    ]
    assert got.exit_code == 0
    assert ("*", "trainer/global_step") in {
        (m.glob_name, m.step_metric) for m in got.metrics
    }  # one x axis

    # the training run's own W&B run (the last start) logs under the same names as the rebuilt one
    (live,) = (run / "wandb").glob("offline-run-*")
    live_keys = {k for row in read_run(live).history for k in row}
    assert {
        "rank_layers/rel_residual/L02",
        "rank/rel_residual/last",
        "train/lr",
        "trainer/epoch",
        "trainer/global_step",
        "val/acc1",
        "rank_layers/table",
    } <= live_keys
    assert not any(re.fullmatch(r"rank/\w+/L\d+", k) for k in live_keys) and "lr" not in live_keys
    rebuilt_keys = {k for row in got.history for k in row}
    assert live_keys <= rebuilt_keys


def test_extra_layers_csv_columns_reach_the_wandb_table(tmp_path):
    """layers.csv may gain columns (e.g. the probe's dtype); the table takes the file's header.
    A diverged run ends its W&B run with exit code 1."""
    run = write_run(tmp_path / "runs", depth=1, accs=(0.5,), status="diverged", reason="nan loss")
    rows = csv_rows(run / "layers.csv")
    with open(run / "layers.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, [*rows[0], "probe_dtype"])
        writer.writeheader()
        writer.writerows({**r, "probe_dtype": "bfloat16"} for r in rows)
    assert main(["wandb-sync", str(tmp_path / "runs"), "--dry-run"]) == 0
    folder = view_folder(run)
    probes = [r["rank_layers/table"] for r in read_run(folder).history if "rank_layers/table" in r]
    tables = [table(folder, p) for p in probes]
    assert [t["columns"][-1] for t in tables] == ["probe_dtype", "probe_dtype"]
    assert [row[-1] for t in tables for row in t["data"]] == ["bfloat16"] * 4
    assert [row[2] for t in tables for row in t["data"]] == [0, 1, 0, 1]  # layer
    got = read_run(folder)
    assert (got.exit_code, got.summary["run/status"], got.summary["run/reason"]) == (
        1,
        "diverged",
        "nan loss",
    )


# 2. uploads --------------------------------------------------------------------------------------


@pytest.fixture
def fake_wandb(tmp_path, monkeypatch):
    """A `wandb` on PATH that records its arguments, and a reachable "server" on loopback."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "wandb.calls"
    bin_dir.mkdir()
    script = bin_dir / "wandb"
    script.write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\n'
        '[ -z "$FAIL" ] || { echo "wandb: ERROR $FAIL" >&2; exit 1; }\n'
    )
    script.chmod(0o755)
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=lambda: [listener.accept() for _ in range(100)], daemon=True).start()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{listener.getsockname()[1]}")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    yield calls
    listener.close()


def uploaded(calls: Path) -> list[str]:
    """The run ids of the folders passed to `wandb sync`, in call order; then forget the calls."""
    lines = calls.read_text().splitlines() if calls.exists() else []
    calls.unlink(missing_ok=True)
    return [line.rsplit("-", 1)[-1] for line in lines]


def test_only_changed_run_directories_are_uploaded_again(tmp_path, fake_wandb, capsys):
    runs = [write_run(tmp_path / "runs", depth=d, accs=(0.3, 0.5)) for d in (1, 2)]
    sync = ["wandb-sync", str(tmp_path / "runs"), "--project", "vd-test"]
    assert main(sync) == 0
    assert sorted(uploaded(fake_wandb)) == sorted(r.name for r in runs)
    assert main(sync) == 0
    assert uploaded(fake_wandb) == []
    assert "uploaded 0 of 2 run directories; 2 unchanged" in capsys.readouterr().out
    with open(runs[1] / "metrics.csv", "a") as f:  # the run trained on (or was requeued) since
        f.write("2,29,,,0.61,0.9,1.5,\n")  # every column, test/acc1 empty
    assert main(sync) == 0
    assert uploaded(fake_wandb) == [runs[1].name]
    assert main([*sync[:-1], "other-project"]) == 0  # another project has neither
    assert len(uploaded(fake_wandb)) == 2


def test_a_failed_upload_is_one_line_and_is_retried_next_time(
    tmp_path, fake_wandb, capsys, monkeypatch
):
    run = write_run(tmp_path / "runs", depth=1)
    monkeypatch.setenv("FAIL", "permission denied for project vd-test")
    assert main(["wandb-sync", str(tmp_path / "runs"), "--project", "vd-test"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vitdepth: error: `wandb sync ")
    assert err[0].endswith("failed (exit 1): wandb: ERROR permission denied for project vd-test")
    monkeypatch.delenv("FAIL")
    assert main(["wandb-sync", str(tmp_path / "runs"), "--project", "vd-test"]) == 0
    assert uploaded(fake_wandb) == [run.name, run.name]


def test_without_a_server_wandb_sync_fails_in_seconds_before_building(
    tmp_path, capsys, monkeypatch
):
    run = write_run(tmp_path / "runs", depth=1)
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.invalid")
    assert main(["wandb-sync", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "wandb.invalid is unreachable" in err[0] and "--dry-run" in err[0]
    assert not (run / "wandb-view").exists()


# 3. the dashboard --------------------------------------------------------------------------------


def test_the_dashboard_is_built_offline_from_keys_a_real_run_logs(resumed_run, tmp_path, capsys):
    pytest.importorskip("wandb_workspaces")
    group = read_json(resumed_run / "run.json")["group"]
    out = tmp_path / "dash.json"
    other = "digits-skip-e16-000000"  # a sweep has one W&B group per variant
    assert (
        main(
            [
                "wandb-dashboard",
                "--project",
                "vitdepth",
                "--group",
                group,
                other,
                "--out",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert f"runs of group {group}, {other}" in printed
    assert "val/acc1 vs trainer/epoch, grouped by variant" in printed
    plan = json.loads(out.read_text())
    assert (
        plan["run_filter"] == {"group": [group, other]} and plan["x_axis"] == "trainer/global_step"
    )
    assert [s["name"] for s in plan["sections"]] == [
        "Depth saturation",
        "Training curves",
        "Rank collapse at the last layer",
        "Per layer, final probe",
    ]

    # every key a panel reads is one the run logs: history keys from metrics.csv, summary, config
    # keys and table columns from the W&B run that wandb-sync built
    built = read_run(view_folder(resumed_run))
    history_keys = {expected_key(c) for c in csv_rows(resumed_run / "metrics.csv")[0]}
    tables = {
        key: table(view_folder(resumed_run), ref)["columns"]
        for key, ref in built.summary.items()
        if isinstance(ref, dict) and ref.get("_type") == "table-file"
    }
    panels = [p for s in plan["sections"] for p in s["panels"]]
    assert {p["kind"] for p in panels} == {"line", "scatter", "table_line"}
    for p in panels:
        if p["kind"] == "line":
            assert {p["x"], p["y"]} <= history_keys and p["group"] in built.config, p
        elif p["kind"] == "scatter":
            for axis in (p["x"], p["y"]):
                where, key = axis.split(":")
                assert key in (built.config if where == "config" else built.summary), p
        else:  # a custom chart over the runs' tables; W&B's query adds each run's "name"
            assert {p["x"], p["y"]} <= set(tables[p["table"]]) and p["group"] in {
                *tables[p["table"]],
                "name",
            }, p
    assert "rank/rel_residual/last" in {p["y"] for p in panels}
    saturation = panels[0]
    assert (saturation["table"], saturation["x"], saturation["y"], saturation["group"]) == (
        "final/run",
        "depth",
        "val_acc1",
        "variant",
    )

    # the view spec that --save would upload holds the same panels, grouping and run filter
    spec = plan["view_spec"]["section"]
    sections = spec["panelBankConfig"]["sections"]
    assert [s["name"] for s in sections] == [s["name"] for s in plan["sections"]]
    assert [len(s["panels"]) for s in sections] == [len(s["panels"]) for s in plan["sections"]]
    lines = [
        p["config"]
        for s in sections
        for p in s["panels"]
        if p["viewType"] == "Run History Line Plot"
    ]
    assert {(c["xAxis"], c["groupBy"]) for c in lines} == {("trainer/epoch", "variant.value")}
    (runset,) = spec["runSets"]
    assert [(f["key"], f["op"], f["value"]) for f in runset["filters"]["filters"]] == [
        ({"name": "group", "section": "run"}, "IN", [group, other])
    ]


def test_the_dashboard_save_without_a_server_fails_in_seconds(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.invalid")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    out = tmp_path / "dash.json"
    started = time.monotonic()
    assert main(["wandb-dashboard", "--project", "vitdepth", "--out", str(out), "--save"]) == 2
    assert time.monotonic() - started < 10
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "vitdepth: error: wandb.invalid is unreachable: --save"
    )
    assert not out.exists()


def test_without_an_api_key_wandb_sync_fails_in_seconds(tmp_path, fake_wandb, capsys, monkeypatch):
    write_run(tmp_path / "runs", depth=1)
    monkeypatch.delenv("WANDB_API_KEY")
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    assert main(["wandb-sync", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no W&B API key" in err[0] and "wandb login" in err[0]
    assert uploaded(fake_wandb) == []


def test_an_unreadable_run_directory_is_skipped_with_a_warning(tmp_path, capsys):
    good = write_run(tmp_path / "runs", depth=1)
    bad = write_run(tmp_path / "runs", depth=2)
    (bad / "run.json").write_text('{"run_id": "x"')  # cut short
    assert main(["wandb-sync", str(tmp_path / "runs"), "--dry-run"]) == 1
    out, err = capsys.readouterr()
    assert f"warning: {bad}: skipped, unreadable: JSONDecodeError" in err
    assert "built 1 of 2 run directories; 0 unchanged, 1 unreadable" in out
    assert view_folder(good).is_dir() and not (bad / "wandb-view").exists()
