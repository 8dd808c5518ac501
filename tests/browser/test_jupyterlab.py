"""What a student sees: the course map opens as a page, with no kernel and no news pop-up;
an untouched lesson opens unmodified, and Run All takes it to its summary; a wrong answer
shows the check's message first; each answered lesson runs without an error output, and its
widgets render and answer their controls. Screenshots go to ``artifacts/browser/``
(printed at the end) so a person can look.

Needs Debian's chromium (``make test`` installs it when running as root).
"""

import json
import shutil
import subprocess
import time
from pathlib import Path

import nbformat
import pytest

from tests.browser import jupyterlab as J
from tools import build_notebooks as B

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]
SHOTS = J.ROOT / "artifacts" / "browser"
LESSONS = sorted(p for p in (J.ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
PIPELINE = J.ROOT / "solutions" / "03_pipeline.py"

if not Path(J.CHROMIUM).exists():
    pytest.skip("chromium is missing: run `make test` as root (it installs Debian's chromium) "
                "or `sudo apt-get install -y chromium`", allow_module_level=True)


def widget_cell(page, selector):
    cell = page.locator(".jp-CodeCell", has=page.locator(selector)).first
    cell.scroll_into_view_if_needed()
    return cell


def wait_text_change(locator, before, seconds=15):
    deadline = time.time() + seconds
    while time.time() < deadline:
        now = locator.inner_text()
        if now != before:
            return now
        time.sleep(0.2)
    raise AssertionError(f"the widget did not react: its text stayed {before[:120]!r}")


def nudge(page, cell, label, key="ArrowRight"):
    """Press ``key`` on the slider labelled ``label``."""
    handle = cell.locator(".widget-hslider", has=page.locator(f"label:text-is('{label}')")).locator(".noUi-handle")
    handle.focus()
    handle.press(key)


def choose(page, cell, title, option=None, **kw):
    """Pick ``option`` in the dropdown titled ``title`` (or the only dropdown: title None)."""
    box = cell.locator(".widget-dropdown", has=page.locator(f"label:text-is('{title}')")) if title else \
        cell.locator(".widget-dropdown")
    box.locator("select").select_option(option, **kw)


def after(text_locator, action, seconds=15):
    """Do ``action`` and return the text once it has changed."""
    before = text_locator.inner_text()
    action()
    return wait_text_change(text_locator, before, seconds)


def start(page, shot, selector, name):
    cell = widget_cell(page, selector)
    cell.locator("img").first.wait_for(state="visible")
    cell.screenshot(path=str(shot(f"{name}_start")))
    return cell, cell.locator(selector)


def drive_ring_stepper(page, shot):
    """Move the step slider with the keyboard, pick another collective from the dropdown;
    the caption must follow each change."""
    cell, caption = start(page, shot, ".ring-caption", "ring_stepper")
    assert "Step 0" in caption.inner_text()
    text = after(caption, lambda: nudge(page, cell, "step"))
    assert text.startswith("step 1 of 6"), text
    assert after(caption, lambda: nudge(page, cell, "step")).startswith("step 2 of 6")
    cell.screenshot(path=str(shot("ring_stepper_step2")))
    text = after(caption, lambda: choose(page, cell, None, "all_gather"))
    assert "of 3 (all-gather)" in text, text
    cell.screenshot(path=str(shot("ring_stepper_all_gather")))


def drive_zero_explorer(page, shot):
    """Choose ZeRO-3 from the dropdown and drag the GPU slider; the numbers follow."""
    cell = widget_cell(page, ".zero-summary")
    summary = cell.locator(".zero-summary")
    cell.screenshot(path=str(shot("zero_explorer_start")))
    text = after(summary, lambda: choose(page, cell, "ZeRO stage", label="ZeRO-3"))
    assert "ZeRO-3" in text, text
    after(summary, lambda: nudge(page, cell, "GPUs"))
    cell.screenshot(path=str(shot("zero_explorer_zero3")))


def drive_activation_explorer(page, shot):
    """Tick sequence parallelism and pick selective recomputation; the total follows."""
    cell = widget_cell(page, ".activation-summary")
    summary = cell.locator(".activation-summary")
    cell.screenshot(path=str(shot("activation_explorer_start")))
    after(summary, lambda: cell.locator(".widget-checkbox input").check())
    text = after(summary, lambda: choose(page, cell, "recompute", "selective"))
    assert "measured on the emulator" in text, text
    cell.screenshot(path=str(shot("activation_explorer_sp_selective")))


def drive_schedule_explorer(page, shot):
    """Switch the schedule to GPipe, then raise the micro-batches; the bubble follows."""
    cell, summary = start(page, shot, ".schedule-summary", "schedule_explorer")
    text = after(summary, lambda: choose(page, cell, "schedule", "gpipe"), seconds=30)
    assert "measured bubble 27.27%; formula 27.27%" in text, text
    text = after(summary, lambda: nudge(page, cell, "m (micro)"), seconds=30)
    assert "measured bubble 25.00%; formula 25.00%" in text, text
    cell.screenshot(path=str(shot("schedule_explorer_gpipe_m9")))


def drive_ring_attention_stepper(page, shot):
    """Step the ring forward with the keyboard, then switch the layout; the caption follows."""
    cell, caption = start(page, shot, ".ring-attention-caption", "ring_attention")
    assert caption.inner_text().startswith("step 1 of 3")
    text = after(caption, lambda: nudge(page, cell, "step"))
    assert text.startswith("step 2 of 3") and "7, 7, 7, 7" in text, text
    text = after(caption, lambda: choose(page, cell, "layout", "contiguous"))
    assert "Work so far per rank: 4, 8, 12, 12" in text, text
    cell.screenshot(path=str(shot("ring_attention_contiguous_step2")))


def drive_routing_explorer(page, shot):
    """Raise the router's skew, then make the layer dropless; the drops follow."""
    cell, summary = start(page, shot, ".routing-summary", "routing_explorer")
    assert summary.inner_text().startswith("56 of 1024 assignments dropped")
    text = after(summary, lambda: nudge(page, cell, "skew"))
    assert text.startswith("101 of 1024"), text
    text = after(summary, lambda: nudge(page, cell, "capacity (0: none)", "Home"))
    assert text.startswith("0 of 1024 assignments dropped (dropless)"), text
    cell.screenshot(path=str(shot("routing_explorer_skew_dropless")))


def drive_failure_explorer(page, shot):
    """Tick asynchronous saving, then lengthen the interval; the goodput follows."""
    cell, summary = start(page, shot, ".failure-summary", "failure_explorer")
    assert "the job fails every 3.09 h" in summary.inner_text()
    text = after(summary, lambda: cell.locator(".widget-checkbox input").check(), seconds=30)
    assert text.startswith("16,384 GPUs") and "An asynchronous save stops training" in text, text
    text = after(summary, lambda: nudge(page, cell, "interval (min)"), seconds=30)
    assert "Saving every 30 min" in text, text
    cell.screenshot(path=str(shot("failure_explorer_async_30min")))


def drive_mesh_planner(page, shot):
    """Push TP past the GPUs of a node: the plan turns red and says why; back to 8, then
    a deeper pipeline: valid again, with a larger bubble."""
    cell, summary = start(page, shot, ".mesh-summary", "mesh_planner")
    assert summary.inner_text().startswith("OK"), summary.inner_text()
    text = after(summary, lambda: nudge(page, cell, "TP"))
    assert text.startswith("INVALID") and "passes the 8 GPUs of a node" in text, text
    cell.screenshot(path=str(shot("mesh_planner_tp16")))
    after(summary, lambda: nudge(page, cell, "TP", "ArrowLeft"))
    text = after(summary, lambda: nudge(page, cell, "PP"))
    assert "not the 64 GPUs" in text, text


DRIVERS = {"00_collectives": [drive_ring_stepper], "01_data_parallel": [drive_zero_explorer],
           "02_tensor_parallel": [drive_activation_explorer], "03_pipeline": [drive_schedule_explorer],
           "04_context_parallel": [drive_ring_attention_stepper],
           "05_expert_parallel": [drive_routing_explorer], "06_mesh": [drive_mesh_planner],
           "07_failures": [drive_failure_explorer]}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    nbdir, home = tmp_path_factory.mktemp("notebooks"), tmp_path_factory.mktemp("home")
    for nb in LESSONS:  # answered lessons, outputs cleared, in a throwaway folder
        book = nbformat.read(nb, 4)
        for c in book.cells:
            if c.cell_type == "code":
                c.outputs, c.execution_count = [], None
        nbformat.write(book, nbdir / nb.name)
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


def test_run_all_on_an_untouched_lesson_reaches_its_summary(lab):
    """Lesson 03 as handed out: Run All runs every cell (it used to stop at Problem 8.2),
    each check says its exercise is not attempted, and the summary at the end lists them
    all; it is the only cell with an error."""
    page, base, token, nbdir = lab
    shot = shots_for("student_lesson")
    J.open_notebook(page, base, token, "student_03_pipeline.ipynb")
    page.screenshot(path=str(shot("opened")))
    first = page.locator(".jp-Cell").first.inner_text()
    assert first.lstrip().startswith("Lesson 03"), first[:200]
    J.run_all(page, timeout=480_000)
    check = page.locator(".jp-CodeCell", has=page.locator("text=NOT ATTEMPTED Exercise 3.1")).first
    check.scroll_into_view_if_needed()
    check.screenshot(path=str(shot("check_not_attempted")))
    summary = page.locator(".jp-CodeCell").last
    summary.scroll_into_view_if_needed()
    summary.screenshot(path=str(shot("summary")))
    text = summary.inner_text()
    assert "0 of 6 exercises passed" in text and "not attempted  Exercise 3.1: 1F1B as data" in text, text
    assert "NotAllPassed: 0 of 6 exercises passed" in text and "Traceback" not in text, text
    J.save(page)
    ran = nbformat.read(nbdir / "student_03_pipeline.ipynb", 4)
    failing = [c.metadata.get("tags") for c in ran.cells if c.cell_type == "code"
               for o in c.outputs if o.output_type == "error"]
    assert failing == [["summary"]], failing
    print(f"\nscreenshots of a student's Run All: {shot('x').parent}")


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


@pytest.mark.parametrize("nb", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_runs_and_widgets_respond(lab, nb):
    page, base, token, nbdir = lab
    J.open_notebook(page, base, token, nb.name)
    J.run_all(page)
    J.save(page)
    ran = nbformat.read(nbdir / nb.name, 4)
    errors = [(i, o.ename, o.evalue) for i, c in enumerate(ran.cells) if c.cell_type == "code"
              for o in c.outputs if o.output_type == "error"]
    assert not errors, f"error outputs in the browser: {errors}"
    assert all(c.execution_count for c in ran.cells if c.cell_type == "code")
    passed = sum("PASSED" in "".join(o.get("text", "") for o in c.outputs) for c in ran.cells if c.cell_type == "code")
    assert passed >= 1, "no check cell printed PASSED"
    shot = shots_for(nb.stem)
    for drive in DRIVERS.get(nb.stem, []):
        drive(page, shot)
    print(f"\nscreenshots of {nb.stem}'s widgets: {shot('x').parent}")


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
