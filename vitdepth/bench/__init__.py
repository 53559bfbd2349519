"""``vitdepth bench``: training throughput, probe and metric cost, loaders and FLOP rate against
their targets, measured side by side in one process.

    vitdepth bench --out results/bench              # CPU, full sizes (minutes)
    vitdepth bench --quick --out /tmp/bench         # tiny sizes: checks the code, not the speed
    vitdepth bench --device cuda --out results/bench/h200
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import os
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from vitdepth.errors import UsageError


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        help="speed figures (Lightning vs bare, probe and metric cost, loaders, FLOP rate) "
        "against their targets")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes and few repeats (seconds): checks the code")
    p.add_argument("--out", type=Path, default=Path("results/bench"),
                   help="folder for bench.json, bench.md, scaling.png")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads (default: all logical CPUs; 1 with --quick, which "
                   "then stays fast on a shared machine, where 2 threads stall on each other)")
    return p


def busy_cores(seconds: float = 0.5) -> float:
    """Cores kept busy by other processes while this one sleeps, from /proc/stat (the load
    average would count the benchmark's own threads); elsewhere the load average."""
    def ticks() -> tuple[int, int]:  # busy (all but idle and iowait), total: all CPUs' first line
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        return sum(fields) - fields[3] - fields[4], sum(fields)

    try:
        busy, total = ticks()
        time.sleep(seconds)
        busy_end, total_end = ticks()
    except OSError:
        return os.getloadavg()[0]
    return (os.cpu_count() or 1) * (busy_end - busy) / max(total_end - total, 1)


@contextlib.contextmanager
def quiet_lightning() -> Iterator[None]:
    """Silence Lightning's banner lines and the warnings a benchmark triggers on purpose
    (num_workers=0, limit_val_batches=0, an iterable instead of a DataLoader)."""
    names = ("pytorch_lightning", "lightning_fabric")
    levels = {name: logging.getLogger(name).level for name in names}
    try:
        with warnings.catch_warnings():
            for name in names:
                logging.getLogger(name).setLevel(logging.ERROR)
                warnings.filterwarnings("ignore", module=name)
            warnings.filterwarnings("ignore", message=".*does not have many workers.*")
            yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def run(args: argparse.Namespace) -> int:
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device cuda: no CUDA GPU is visible to torch {torch.__version__}; "
                         "run on a GPU machine or use --device cpu")
    threads = (1 if args.quick else os.cpu_count() or 1) if args.threads is None else args.threads
    if threads < 1:
        raise UsageError(f"--threads must be >= 1, got {threads}")
    torch.set_num_threads(threads)

    from vitdepth.bench.core import log, make_plan
    from vitdepth.bench.report import measure, write_report
    from vitdepth.provenance import git_state, hardware, library_versions

    plan, quick = make_plan(args.device, args.quick), " --quick" if args.quick else ""
    load_start, busy_start, started = os.getloadavg()[0], busy_cores(), time.monotonic()
    when = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory(prefix="vitdepth-bench-") as tmp, quiet_lightning():
        results = measure(plan, Path(tmp))
    hw = hardware()
    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU only"
    meta = {"command": f"vitdepth bench --device {args.device}{quick} --out {args.out} "
                       f"--threads {threads}",
            "started": when, "wall_s": time.monotonic() - started, "device": args.device,
            "device_name": device_name, "quick": args.quick,
            "title": (device_name if args.device == "cuda" else hw["processor"])
                     + (" (quick)" if args.quick else ""),
            "threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
            "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "load_start": round(load_start, 2), "load_end": round(os.getloadavg()[0], 2),
            "busy_cores_start": round(busy_start, 2), "busy_cores_end": round(busy_cores(), 2),
            "hardware": hw, "versions": library_versions(), "git": git_state()}
    paths = write_report(args.out, results, plan, meta)
    log(f"wrote {', '.join(str(p) for p in paths)} ({meta['wall_s']:.0f} s)")
    if results["errors"]:
        log(f"sections that failed: {', '.join(results['errors'])} (see bench.md)")
    return 1 if results["errors"] else 0
