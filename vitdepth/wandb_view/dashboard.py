"""``vitdepth wandb-dashboard --project P [--entity E] [--group G...] [--runs RUN_ROOT...]
[--out FILE] [--save]``: the W&B
workspace that compares the variants of a sweep, as code (wandb-workspaces, the ``[wandb]`` extra).

Without ``--save`` it prints the panels, run filter and grouping and writes them, with the view
spec that ``--save`` would upload, to a JSON file; nothing needs a server. The panels read the keys that
``vitdepth wandb-sync`` writes (``vitdepth.wandb_view.keys``, ``consolidate.FINAL_COLUMNS``).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from vitdepth import rundir
from vitdepth.errors import UsageError
from vitdepth.wandb_view.keys import (
    EPOCH,
    FINAL_TABLE,
    LAYERS_TABLE,
    STEP,
    add_destination_arguments,
)
from vitdepth.wandb_view.server import require_server

GROUP_BY = "variant"  # a top-level config key of every run


@dataclass(frozen=True)
class Panel:
    """One chart. kind: line (history ``y`` vs ``x``, runs grouped by ``group``), scatter (summary
    or config ``y`` vs ``x``, one point per run), table_line (rows of the run's table ``table``, one
    line per ``group`` value)."""

    kind: str
    title: str
    x: str
    y: str
    group: str | None = None
    table: str | None = None


def sections() -> list[tuple[str, list[Panel]]]:
    """The workspace, summaries first: saturation, then curves, then per-layer detail."""
    final = FINAL_TABLE
    return [
        (
            "Depth saturation",
            [
                Panel(
                    "table_line",
                    "final val/acc1 vs depth, by variant",
                    "depth",
                    "val_acc1",
                    "variant",
                    final,
                ),
                Panel(
                    "scatter",
                    "final val/acc1 vs depth (one point per run)",
                    "config:depth",
                    "summary:val/acc1",
                ),
                Panel(
                    "scatter",
                    "last-layer rel_residual vs final val/acc1",
                    "summary:rank/rel_residual/last",
                    "summary:val/acc1",
                ),
            ],
        ),
        (
            "Training curves",
            [
                Panel("line", "val/acc1 vs epoch, by variant", EPOCH, "val/acc1", GROUP_BY),
                Panel(
                    "line",
                    "train/loss_epoch vs epoch, by variant",
                    EPOCH,
                    "train/loss_epoch",
                    GROUP_BY,
                ),
            ],
        ),
        (
            "Rank collapse at the last layer",
            [
                Panel(
                    "line",
                    f"rank/{m}/last vs epoch, by variant",
                    EPOCH,
                    f"rank/{m}/last",
                    GROUP_BY,
                )
                for m in rundir.LAYER_METRICS
            ],
        ),
        (
            "Per layer, final probe",
            [
                Panel(
                    "table_line",
                    f"{m} vs layer (final probe), one line per run",
                    "layer",
                    m,
                    "name",
                    LAYERS_TABLE,
                )
                for m in rundir.LAYER_METRICS
            ],
        ),
    ]


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "wandb-dashboard",
        help="build the W&B workspace that compares the variants of a sweep",
        description="Build a W&B workspace (saturation plot, accuracy and rank-collapse curves by "
        "variant, per-layer profiles of the final probe) for runs uploaded by "
        "`vitdepth wandb-sync`. Prints it and writes it as JSON; --save creates it in W&B. "
        "Needs `pip install vitdepth[wandb]`.",
    )
    add_destination_arguments(parser, "your default entity on --save")
    parser.add_argument(
        "--group",
        nargs="+",
        metavar="G",
        help="only the runs of these W&B groups (e.g. digits-full-e16-f5dfde; a sweep has one "
        "per variant); default: all runs of the project, or those of --runs",
    )
    parser.add_argument(
        "--runs",
        nargs="+",
        type=Path,
        metavar="RUN_ROOT",
        help="also the W&B groups of the run directories under these folders (a sweep's run root)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("wandb-dashboard.json"),
        help="where to write the JSON (default: wandb-dashboard.json)",
    )
    parser.add_argument(
        "--save", action="store_true", help="create the workspace in W&B (needs the server)"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    if args.save:
        require_server(
            "--save needs the W&B server; without --save the workspace is only printed and "
            "written as JSON"
        )
    entity = args.entity or ""  # on --save, the default entity is looked up just before saving
    groups = [*(args.group or []), *run_groups(args.runs or [])] or None
    workspace = build_workspace(args.project, entity, groups)
    plan = describe(workspace, groups)
    print(render(plan))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rundir.atomic_write_json(args.out, {**plan, "view_spec": view_spec(workspace)})
    print(f"wrote {args.out}")
    if args.save:
        save(workspace)
    return 0


def run_groups(roots: list[Path]) -> list[str]:
    """The W&B groups (run.json's ``group``) of the run directories under ``roots``, sorted."""
    from vitdepth.report.load import find_run_dirs

    return sorted({rundir.read_json(d / rundir.RUN_JSON)["group"] for d in find_run_dirs(roots)})


def build_workspace(project: str, entity: str, groups: list[str] | None):
    """The wandb-workspaces Workspace; builds without a server."""
    ws, wr = _workspaces()
    from wandb_workspaces import expr

    return ws.Workspace(
        entity=entity,
        project=project,
        name=f"vitdepth {' '.join(groups or [project])}"[:128],
        settings=ws.WorkspaceSettings(x_axis=STEP),
        runset_settings=ws.RunsetSettings(
            filters=[expr.Metric("Group").isin(groups)] if groups else []
        ),
        sections=[
            ws.Section(name=name, is_open=True, panels=[_panel(p, wr) for p in panels])
            for name, panels in sections()
        ],
    )


def _panel(panel: Panel, wr):
    if panel.kind == "line":
        return wr.LinePlot(
            title=panel.title,
            x=panel.x,
            y=[panel.y],
            groupby=wr.Config(panel.group),
            groupby_aggfunc="mean",
            groupby_rangefunc="stderr",
        )
    if panel.kind == "scatter":
        return wr.ScatterPlot(title=panel.title, x=_metric(panel.x, wr), y=_metric(panel.y, wr))
    return wr.CustomChart(
        query={"summaryTable": {"tableKey": panel.table}},
        chart_name="wandb/line/v0",
        chart_fields={"x": panel.x, "y": panel.y, "stroke": panel.group},
        chart_strings={"title": panel.title},
    )


def _metric(name: str, wr):
    section, key = name.split(":", 1)
    return wr.Config(key) if section == "config" else wr.SummaryMetric(key)


def describe(workspace, groups: list[str] | None) -> dict:
    return {
        "entity": workspace.entity or None,
        "project": workspace.project,
        "name": workspace.name,
        "run_filter": {"group": groups} if groups else {},
        "x_axis": STEP,
        "sections": [
            {"name": name, "panels": [asdict(p) for p in panels]} for name, panels in sections()
        ],
    }


def render(plan: dict) -> str:
    where = f"{plan['entity'] or '(your default entity)'}/{plan['project']}"
    groups = plan["run_filter"].get("group")
    runs = f"runs of group {', '.join(groups)}" if groups else "all runs"
    lines = [f"workspace {plan['name']!r} in {where}: {runs}, x axis {plan['x_axis']}"]
    for section in plan["sections"]:
        lines.append(f"  {section['name']}")
        for p in section["panels"]:
            source = f" from table {p['table']}" if p["table"] else ""
            by = f", grouped by {p['group']}" if p["group"] else ""
            lines.append(f"    {p['kind']:<10} {p['y']} vs {p['x']}{by}{source}")
    return "\n".join(lines)


def view_spec(workspace) -> dict:
    """The view spec that ``Workspace.save`` uploads."""
    return json.loads(workspace._to_model().spec.model_dump_json(by_alias=True, exclude_none=True))


def save(workspace) -> None:
    """Create the workspace in W&B, under the logged-in user's default entity if none was given."""
    import wandb

    try:
        workspace.entity = workspace.entity or wandb.Api().default_entity
        workspace.save()
    except (wandb.errors.Error, OSError, ValueError) as error:
        message = str(error).strip().splitlines()
        raise UsageError(
            f"saving the workspace failed: {message[0] if message else type(error).__name__}"
        ) from None
    print(f"saved {workspace.url}")


def _workspaces():
    try:
        import wandb_workspaces.reports.v2 as wr
        import wandb_workspaces.workspaces as ws
    except ImportError:
        raise UsageError(
            "wandb-dashboard needs wandb-workspaces: pip install 'vitdepth[wandb]'"
        ) from None
    return ws, wr
