"""kvsim.outputs.report: the page's tables, its embedded pictures, and atomic writing."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from pathlib import Path

import pytest

import kvsim.outputs.report
from kvsim.outputs.report import build_report, latency_rows, summary_rows, write_report
from kvsim.plots import PICTURES, V1_PICTURES
from kvsim.plots.standard import OFFLOAD_PICTURE_NAMES
from kvsim.runner import RunResult

# the pictures of a classic run (the pressured runs are classic)
# A classic run's pictures: no v1 prefix cache, no KV offload tier.
CLASSIC_PICTURES = {
    n: f for n, f in PICTURES.items() if n not in V1_PICTURES + OFFLOAD_PICTURE_NAMES
}


@pytest.fixture
def tiny_run(toy_sim: Callable[..., RunResult]) -> RunResult:
    return toy_sim([(0, 4, 6), (0, 4, 6), (1, 40, 2)], block_size=4, num_blocks=4)


def test_page_embeds_every_picture_as_png(tiny_run: RunResult) -> None:
    page = build_report(tiny_run, title="a <tiny> run", names=["gantt", "latency"])
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 2
    assert all(base64.b64decode(i).startswith(b"\x89PNG") for i in images)
    assert "<title>a &lt;tiny&gt; run</title>" in page  # text is escaped


def test_summary_and_latency_tables(tiny_run: RunResult) -> None:
    rows = dict(summary_rows(tiny_run.summary))
    assert rows["finished / rejected / aborted / unfinished"] == "2 / 1 / 0 / 0"
    assert rows["KV pool"] == "4 blocks x 4 tokens"
    assert rows["preemptions"] == "1"
    ttft = next(r for r in latency_rows(tiny_run.summary) if r[0] == "TTFT")
    assert ttft[2] == "1.50 s"  # both first tokens at the end of the 1.5 s prefill
    empty = latency_rows({"ttft_s": {"mean": None, "p50": None, "p90": None, "p99": None}})
    assert empty[1] == ("TTFT", "-", "-", "-", "-")


def test_options_and_window_are_shown(tiny_run: RunResult) -> None:
    page = build_report(tiny_run, names=["free-blocks"], t_from=1.0, t_to=2.0)
    assert "Pictures over 1 s to 2 s." in page
    assert "<th>num_blocks</th>" in page and "<th>block_size</th>" in page


def test_write_report_leaves_nothing_half_written(
    tiny_run: RunResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "report.html"
    write_report(tiny_run, out)
    assert out.read_text().count("data:image/png") == len(CLASSIC_PICTURES)
    before = out.read_bytes()

    def failing_draw(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(kvsim.outputs.report, "draw", failing_draw)
    with pytest.raises(RuntimeError):
        write_report(tiny_run, out)
    assert out.read_bytes() == before
    assert list(tmp_path.iterdir()) == [out]
