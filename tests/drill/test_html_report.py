"""The report page (issue 11): a real small drill on the local backend writes WORKDIR/report/ and
says where; the page, opened in headless Chromium (Debian's, driven by Playwright), loads every
image, logs no console error and has a table under every plot with the report's exact values; the
PNGs are not blank. `faultdrill report WORKDIR --html OUT` writes the same page elsewhere."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from drills import FAULTDRILL, KILL_RANK_1, PACED, write_spec
from report_page import every_image_loaded, open_page


@pytest.fixture(scope="module")
def drilled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp_path = tmp_path_factory.mktemp("page")
    spec = write_spec(tmp_path, name="page", faults=KILL_RANK_1, baseline=True, parallel_runs=2, workload=PACED)
    done = subprocess.run([*FAULTDRILL, "drill", str(spec), "--format", "json"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return {"report": json.loads(done.stdout), "stderr": done.stderr, "workdir": tmp_path / "work"}


def test_the_drill_writes_its_page_and_the_browser_shows_every_plot_and_table(drilled: dict[str, Any]) -> None:
    page_path = drilled["workdir"] / "report" / "index.html"
    assert f"the report page: {page_path}" in drilled["stderr"], "the drill says where its page is"
    seen = open_page(page_path)
    assert seen["errors"] == []
    assert every_image_loaded(seen, page_path.parent), seen["images"]
    sections = seen["sections"]
    for title in ("Timeline of r000", "Timeline of r000-baseline", "Time to recover", "Lost work", "Goodput",
                  "Checkpoints"):
        assert title in sections, sorted(sections)
        assert sections[title]["images"] == 1 and sections[title]["tables"], title
    # The tables hold the exact values the report holds.
    [recovery] = next(run for run in drilled["report"]["runs"] if run["run_id"] == "r000")["recoveries"]
    [ttr_table] = sections["Time to recover"]["tables"]
    assert ttr_table[1][:4] == ["torch", "resubmit", "RANK_SIGNAL", "1"]
    assert ttr_table[1][-1] == f"{recovery['ttr_s']:.4g}"
    lost = sections["Lost work"]["tables"][0][1]
    assert lost[0] == "r000" and lost[3:5] == [str(recovery["resumed_from_step"]), str(recovery["lost_steps"])]
    timeline_rows = sections["Timeline of r000"]["tables"][0][1:]
    assert [row[1] for row in timeline_rows] == [a["state"] for a in
                                                 next(r for r in drilled["report"]["runs"] if r["run_id"] == "r000")["attempts"]]


def test_report_html_writes_the_page_elsewhere(drilled: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "elsewhere"
    done = subprocess.run([*FAULTDRILL, "report", str(drilled["workdir"]), "--format", "json", "--html", str(out)],
                          capture_output=True, text=True, timeout=300, check=True)
    assert json.loads(done.stdout)["runs"] == drilled["report"]["runs"]
    assert (out / "index.html").exists() and sorted(p.name for p in out.glob("*.png")) == sorted(
        p.name for p in (drilled["workdir"] / "report").glob("*.png"))
    seen = open_page(out / "index.html")
    assert seen["errors"] == [] and every_image_loaded(seen, out)


def test_runs_that_differ_in_their_interval_get_the_interval_plot_against_daly(tmp_path: Path) -> None:
    """The interval section from report rows (as the interval campaign's runs give them): measured
    goodput per interval beside the model's, the mean lost work beside interval / 2."""
    from orchestrator.report.html import _interval_row, _interval_section
    from report_page import not_blank

    def run(run_id: str, every: int, lost_s: list[float], elapsed: float) -> dict[str, Any]:
        return {"run_id": run_id, "is_baseline": False, "faults": [{}] * len(lost_s), "step_time_s": 0.01,
                "checkpoint_every_steps": every, "final_step": 1000, "checkpoints": {"count": 5, "mean_blocking_s": 0.05},
                "attempts": [{"submitted": 0.0, "ended": elapsed}],
                "recoveries": [{"lost_s": lost, "ttr_s": 2.0} for lost in lost_s]}

    runs = [run("a", 50, [0.2, 0.3], 14.0), run("b", 400, [1.9, 2.1], 16.0)]
    section = _interval_section(runs, tmp_path)
    assert section is not None and not_blank(tmp_path / section.image)
    [(header, rows)] = section.tables
    assert header[:3] == ["every steps", "interval s", "measured goodput"]
    assert [row[0] for row in rows] == [50, 400]
    assert rows[0][2] == pytest.approx(10.0 / 14.0) and rows[1][4] == pytest.approx(2.0) and rows[1][5] == pytest.approx(2.0)
    # lost work against interval / 2: 0.25 s of 0.25 s (1.00, within 15 %), 2.0 s of 2.0 s (1.00)
    assert [row[6] for row in rows] == [pytest.approx(1.0), pytest.approx(1.0)] and [row[7] for row in rows] == ["yes"] * 2
    assert "measured optimum: every 50 steps (0.5 s)" in section.note
    assert _interval_row(100, 0.01, 0.5, None, 0.8)[6:] == [pytest.approx(1.6), "no"]
    # Daly's goodput tau / (M e^(R/M) (e^((tau + delta)/M) - 1)) for run b: tau = 400 steps x 0.01 s,
    # delta = 0.05 s, R = 2 s, M = 30 s elapsed / 4 failures = 7.5 s (worked by hand).
    assert rows[1][3] == pytest.approx(0.570518, rel=1e-5)
    assert _interval_section(runs[:1], tmp_path) is None, "one interval: nothing to compare"
    for each in runs:  # faults that fired with their drawn delays: the MTBF is their mean
        each["faults"] = [{"at": 1.0, "planned_delay_s": 3.0}, {"at": 2.0, "planned_delay_s": 5.0}]
    [(_, rows)] = _interval_section(runs, tmp_path).tables
    assert rows[1][3] == pytest.approx(0.346100, rel=1e-5)  # the same with M = (3 + 5) / 2 = 4 s
