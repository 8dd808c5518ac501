"""What a student sees: the course map opens as a page, with no kernel and no news pop-up;
an untouched lesson opens unmodified; Run All takes each untouched lesson to its summary,
every check saying its exercise is not attempted, and its widgets render and answer their
controls (how each widget is driven: tests/browser/widget_drivers.py); a wrong answer
stops Run All at its check, with the check's message first. This is the suite's one run of
each untouched lesson; the answer keys run under strict nbval (tests/test_notebooks.py).
Screenshots go to ``artifacts/browser/`` (printed at the end) so a person can look.

Needs Debian's chromium (``make test`` installs it when running as root).
"""

import json
import shutil
import subprocess
import time
from pathlib import Path

import nbformat
import pytest

from tests._notebooks import LESSONS, PIPELINE, assert_untouched_run, ids
from tests.browser import jupyterlab as J
from tests.browser.widget_drivers import DRIVERS, drive_ring_stepper
from tools import build_notebooks as B

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]
SHOTS = J.ROOT / "artifacts" / "browser"

if not Path(J.CHROMIUM).exists():
    pytest.skip("chromium is missing: run `make test` as root (it installs Debian's chromium) "
                "or `sudo apt-get install -y chromium`", allow_module_level=True)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    nbdir, home = tmp_path_factory.mktemp("notebooks"), tmp_path_factory.mktemp("home")
    for src in LESSONS:  # the lessons as handed out, in a throwaway folder
        nbformat.write(B.render(src, "lessons"), nbdir / f"{src.stem}.ipynb")
    broken = nbformat.v4.new_notebook()
    broken.cells = [nbformat.v4.new_code_cell(
        "from emulator.widgets import RingStepper\nw = RingStepper(n=4)\nw.step.unobserve_all()  # broken on purpose\nw")]
    broken.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(broken, nbdir / "broken_widget.ipynb")
    shutil.copy(J.ROOT / "lessons" / "index.md", nbdir / "index.md")
    # a student's first hour: lesson 03 as handed out, and with a wrong answer to Problem 8.2
    nbformat.write(B.render(PIPELINE, "lessons"), nbdir / "student_03_pipeline.ipynb")
    wrong = B.render(PIPELINE, "lessons")
    for cell, answer in zip(wrong.cells, B.render(PIPELINE, "solutions").cells):
        if 'NotImplementedError("Problem 8.2' in cell.source:
            cell.source = answer.source.replace("return m_ideal, m_ideal * seqs_per_micro, m_total",
                                                "return m_total, m_total * seqs_per_micro, m_total")
    nbformat.write(wrong, nbdir / "student_wrong_8_2.ipynb")
    # the same lesson with the metadata the build wrote before (JupyterLab completes it)
    partial = B.render(PIPELINE, "lessons")
    partial.metadata["kernelspec"].pop("language")
    partial.metadata["language_info"] = {"name": "python"}
    nbformat.write(partial, nbdir / "partial_metadata.ipynb")
    with J.jupyter_server(nbdir, home) as (base, token), J.browser() as b:
        page = b.new_page(viewport={"width": 1400, "height": 1000})
        yield page, base, token, nbdir
        page.close()


def shots_for(name):
    folder = SHOTS / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return lambda label: folder / f"{label}.png"


def sessions(base, token):
    return {s["path"] for s in J.api(base, token, "/api/sessions")}


def test_the_course_map_is_a_page_with_no_kernel_and_no_news(lab):
    """``make lab`` opens the course map: rendered Markdown, lessons before instructors;
    no kernel starts for it, and the project's settings keep JupyterLab's news question
    away even in a HOME that has never run JupyterLab."""
    page, base, token, _ = lab
    news = J.api(base, token, "/lab/api/settings/@jupyterlab/apputils-extension:notification")
    assert news["schema"]["properties"]["fetchNews"]["default"] == "false"  # the project's default
    assert "fetchNews" not in news["settings"]  # and not a setting of this HOME
    kernels = len(J.api(base, token, "/api/kernels"))
    page.goto(f"{base}/lab/tree/index.md?token={token}&reset", wait_until="domcontentloaded")
    page.wait_for_selector(".jp-RenderedMarkdown h2", timeout=60_000)  # the preview, not the text editor
    time.sleep(5)  # long enough for a kernel to start, or a toast to pop up, were either coming
    assert len(J.api(base, token, "/api/kernels")) == kernels and "index.md" not in sessions(base, token)
    assert page.locator("text=official Jupyter news").count() == 0, "JupyterLab asked about its news"
    headings = [h.strip() for h in page.locator(".jp-RenderedMarkdown h2").all_inner_texts()]
    order = [headings.index(h) for h in ("Start here", "Lessons", "How to work through a lesson",
                                         "Checking your work", "For instructors")]
    assert order == sorted(order), headings
    page.screenshot(path=str(shots_for("course_map")("course_map")))


def test_opening_an_untouched_lesson_leaves_it_unmodified(lab):
    """Its metadata already says what the kernel will: nothing to fill in, nothing to save.
    The same lesson with the metadata of old (kernelspec without its language,
    language_info with only a name) is marked modified: the test can tell."""
    page, base, token, _ = lab
    J.open_notebook(page, base, token, "partial_metadata.ipynb")
    page.wait_for_function("() => !!document.querySelector('.jp-mod-dirty')", timeout=30_000)
    J.open_notebook(page, base, token, "student_03_pipeline.ipynb")
    time.sleep(3)
    assert not J.is_dirty(page), "opening the lesson marked it modified"


def test_a_wrong_answer_stops_run_all_at_its_check_with_the_message_first(lab):
    page, base, token, _ = lab
    J.open_notebook(page, base, token, "student_wrong_8_2.ipynb")
    page.click(".lm-MenuBar-itemLabel:text-is('Run')", timeout=10_000)
    page.click(".lm-Menu-item:has-text('Run All Cells')", timeout=10_000)
    error = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").first
    error.wait_for(timeout=120_000)
    J.wait_idle(page)
    cell = page.locator(".jp-CodeCell", has=error).first
    cell.scroll_into_view_if_needed()
    cell.screenshot(path=str(shots_for("student_wrong_answer")("problem_8_2")))
    lines = [line for line in error.inner_text().splitlines() if line.strip()]
    assert lines[0].startswith("CheckFailed: Problem 8.2 (micro-batches, bubble over the ideal time"), lines
    assert "expected 220, got 209" in lines[0] and len(lines) == 1, lines
    assert "grade.problem_8_2" in cell.inner_text()


@pytest.mark.parametrize("src", LESSONS, ids=ids(LESSONS))
def test_run_all_takes_an_untouched_lesson_to_its_summary_and_its_widgets_respond(lab, src):
    """The lesson as handed out: Run All runs every cell (lesson 03 used to stop at Problem
    8.2), each check says its exercise is not attempted, and the summary at the end, the
    only cell with an error, lists them all; then its widgets answer their controls."""
    page, base, token, nbdir = lab
    shot = shots_for(src.stem)
    J.open_notebook(page, base, token, f"{src.stem}.ipynb")
    first = page.locator(".jp-Cell").first.inner_text()
    assert first.lstrip().startswith(f"Lesson {src.stem[:2]}"), first[:200]
    page.screenshot(path=str(shot("opened")))
    J.run_all(page, timeout=480_000)
    check = page.locator(".jp-CodeCell", has=page.locator("text=NOT ATTEMPTED")).first
    check.scroll_into_view_if_needed()
    check.screenshot(path=str(shot("check_not_attempted")))
    summary = page.locator(".jp-CodeCell").last
    summary.scroll_into_view_if_needed()
    summary.screenshot(path=str(shot("summary")))
    said = summary.inner_text()
    assert "NotAllPassed: 0 of " in said and "Traceback" not in said, said
    J.save(page)
    assert_untouched_run(nbformat.read(nbdir / f"{src.stem}.ipynb", 4), src)
    for drive in DRIVERS.get(src.stem, []):
        drive(page, shot)
    print(f"\nscreenshots of {src.stem}, Run All and its widgets: {shot('x').parent}")


def test_a_broken_widget_is_caught(lab):
    page, base, token, _ = lab
    J.open_notebook(page, base, token, "broken_widget.ipynb")
    J.run_all(page)
    with pytest.raises(AssertionError, match="the widget did not react"):
        drive_ring_stepper(page, shots_for("broken_widget"))


def test_make_lab_serves_the_course_index(tmp_path):
    """``make lab`` really starts a server that serves the course map, lessons/index.md,
    with the project's settings."""
    port, token = J.free_port(), "make-lab-smoke"
    env = J.throwaway_env(tmp_path)
    args = f"--no-browser --ip=127.0.0.1 --port={port} --IdentityProvider.token={token} --allow-root"
    proc = subprocess.Popen(["make", "-s", "lab", f"LAB_ARGS={args}"], cwd=J.ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        status, body = J.wait_http(f"http://127.0.0.1:{port}/api/contents/lessons/index.md?type=file&format=text"
                                   f"&token={token}", 120)
        assert status == 200
        assert json.loads(body)["content"].startswith("# Parallelism from Scratch")
        status, page = J.wait_http(f"http://127.0.0.1:{port}/lab/tree/lessons/index.md?token={token}")
        assert status == 200 and b"JupyterLab" in page
        base = f"http://127.0.0.1:{port}"
        viewers = J.api(base, token, "/lab/api/settings/@jupyterlab/docmanager-extension:plugin")
        assert viewers["schema"]["properties"]["defaultViewers"]["default"] == {"markdown": "Markdown Preview"}
    finally:
        import os
        import signal
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
