"""The benchmark page: the benchmark command writes it, one section per result folder
(newest run first), and the committed docs/benchmarks.md and README table are what the
code makes of the committed runs in docs/bench."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_rnn.bench.page import headline, write_page
from lightning_rnn.bench.report import read_csv

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
QUICK_SECTIONS = ["varlen", "scaling", "features", "projection", "alone"]  # off: the grid alone is enough here


def _links(text: str) -> list[str]:
    """Targets of the page's Markdown links and images, anchors and web addresses left out."""
    return [t for t in re.findall(r"\]\(([^)#\s]+)\)", text) if "://" not in t]


@pytest.fixture(scope="module")
def page_run(tmp_path_factory):
    """``python -m lightning_rnn task=benchmark bench=smoke`` into tmp/bench/this_machine,
    with ``bench.page``, next to a folder of an older run on another machine."""
    root = tmp_path_factory.mktemp("docs")
    older = root / "bench" / "older_machine"
    older.mkdir(parents=True)
    (older / "varlen.md").write_text("### variable lengths\n\n| cell |\n|---|\n| lstm |\n\n"
                                     "*Run:* date: 2000-01-01 00:00 UTC; torch 2.0.0, python 3.11.7, x86_64; "
                                     "device: cpu (An Older CPU), torch threads: 2; timing: ...\n")
    (older / "results.md").write_text("# Benchmark results\n")
    out, page = root / "bench" / "this_machine", root / "benchmarks.md"
    args = ["task=benchmark", "bench=smoke", f"bench.out_dir={out}", f"bench.page={page}", "bench.table=none",
            "bench.threads=1", *[f"bench.{s}.enabled=false" for s in QUICK_SECTIONS]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "1"}
    done = subprocess.run([sys.executable, "-m", "lightning_rnn", *args], cwd=root, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return root, out, page


def test_the_benchmark_command_writes_the_page(page_run):
    root, out, page = page_run
    text = page.read_text()
    assert text.startswith("# Benchmarks\n") and "## Method" in text
    sections = re.findall(r"^## (\S+)$", text, flags=re.M)
    assert sections == ["Method", "this_machine", "older_machine"]  # the newest run first
    assert "An Older CPU, 2000-01-01 00:00 UTC, torch 2.0.0, 2 thread(s)" in text
    grid = read_csv(out / "grid.csv")
    this = text.split("## this_machine", 1)[1].split("## older_machine", 1)[0]
    for row in grid.rows:  # every point of the smoke grid, with its ratio against torch.nn
        assert f"| {row['cell'].upper()} | {row['layers']}x{row['hidden']} | {row['time_ours/torch']:.2f} |" in this
    assert "![lstm_time](bench/this_machine/lstm_time.png)" in this
    for target in _links(text):
        assert (page.parent / target).is_file(), target


def test_the_page_keeps_the_latest_run_per_folder(page_run):
    """A folder holds one run: rewriting the page from the folders shows what they hold now."""
    root, out, page = page_run
    (root / "bench" / "older_machine" / "results.md").unlink()  # no longer a result folder
    rewritten = write_page(root / "again.md", root / "bench").read_text()
    assert re.findall(r"^## (\S+)$", rewritten, flags=re.M) == ["Method", "this_machine"]


def test_write_page_refuses_a_root_without_result_folders(tmp_path):
    with pytest.raises(ValueError, match=r"bench.page: no result folders"):
        write_page(tmp_path / "page.md", tmp_path)


def test_the_page_setting_must_name_a_markdown_file():
    from lightning_rnn.bench.config import BenchConfig

    with pytest.raises(ValueError, match=r"bench.page: expected the path of a Markdown"):
        BenchConfig(page="docs/benchmarks.txt")


@pytest.mark.skipif(not (DOCS / "bench").is_dir(), reason="docs/ is not next to the tests (an installed copy)")
def test_the_committed_page_is_what_the_benchmark_writes_from_docs_bench(tmp_path):
    """docs/benchmarks.md is not edited by hand: rebuilt from docs/bench it comes out the same."""
    shutil.copytree(DOCS / "bench", tmp_path / "docs" / "bench")
    rebuilt = write_page(tmp_path / "docs" / "benchmarks.md", tmp_path / "docs" / "bench").read_text()
    assert (DOCS / "benchmarks.md").read_text() == rebuilt



@pytest.mark.skipif(not (DOCS / "bench").is_dir(), reason="docs/ is not next to the tests (an installed copy)")
def test_the_readme_results_table_is_the_latest_xeon_run():
    table = headline(read_csv(DOCS / "bench" / "xeon" / "grid.csv"))
    assert table in (REPO / "README.md").read_text()
