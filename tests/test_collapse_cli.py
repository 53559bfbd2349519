"""``vitdepth collapse`` end to end, and the one-line errors of the study verbs."""

import csv
import subprocess
import sys

import pytest

from vitdepth.cli import main
from vitdepth.collapse.measure import COLUMNS


def test_collapse_writes_csvs_and_plot(tmp_path):
    out = tmp_path / "collapse"
    code = main(["collapse", "--variants", "pure,full", "--depths", "1,3", "--seeds", "0,1", "--n-images", "4",
                 "--embed-dim", "32", "--num-heads", "2", "--img-size", "16", "--out", str(out)])
    assert code == 0
    rows = list(csv.DictReader(open(out / "collapse.csv")))
    assert tuple(rows[0]) == COLUMNS
    assert len(rows) == 2 * 2 * (2 + 4)  # variants x seeds x (layers of depth 1 and 3)
    assert rows[0]["attn_entropy"] == "" or rows[0]["attn_entropy"] == "nan"
    slopes = list(csv.DictReader(open(out / "slopes.csv")))
    assert [r["variant"] for r in slopes] == ["pure", "full"] and all(r["depth"] == "3" for r in slopes)
    assert (out / "collapse.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("args,message", [
    (["--variants", "pure,bogus"], "unknown variant 'bogus'; choose one of: pure, skip"),
    (["--depths", "0,2"], "depths must be >= 1, got 0"),
    (["--num-heads", "5"], "embed_dim 192 is not divisible by num_heads 5"),
    (["--patch-size", "5"], "patch_size 5 does not divide img_size 32"),
    (["--data", "imagenet"], "unknown input data 'imagenet'"),
])
def test_bad_input_gets_one_line_and_exit_code_2(tmp_path, capsys, args, message):
    out = tmp_path / "never"
    defaults = [] if "--depths" in args else ["--depths", "1"]
    assert main(["collapse", *args, *defaults, "--seeds", "0", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not out.exists()


def test_console_entry_point_exits_2_without_traceback(tmp_path):
    done = subprocess.run([sys.executable, "-m", "vitdepth", "collapse", "--variants", "nope", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == ("vitdepth: error: unknown variant 'nope'; choose one of: "
                                   + ", ".join(__import__("vitdepth.models").models.VARIANTS))
