"""What a student sees: each lesson opens in JupyterLab, runs without an error output, and its
widgets render and answer their controls. Screenshots of widget cells go to
``artifacts/browser/`` (printed at the end) so a person can look.

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

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]
SHOTS = J.ROOT / "artifacts" / "browser"
LESSONS = sorted(p for p in (J.ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))

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


DRIVERS = {"00_collectives": [drive_ring_stepper], "01_data_parallel": [drive_zero_explorer],
           "02_tensor_parallel": [drive_activation_explorer], "03_pipeline": [drive_schedule_explorer],
           "04_context_parallel": [drive_ring_attention_stepper],
           "05_expert_parallel": [drive_routing_explorer]}


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
    with J.jupyter_server(nbdir, home) as (base, token), J.browser() as b:
        page = b.new_page(viewport={"width": 1400, "height": 1000})
        yield page, base, token, nbdir
        page.close()


def shots_for(name):
    folder = SHOTS / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return lambda label: folder / f"{label}.png"


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
    """``make lab`` really starts a server that serves lessons/index.ipynb."""
    port, token = J.free_port(), "make-lab-smoke"
    env = J.throwaway_env(tmp_path)
    args = f"--no-browser --ip=127.0.0.1 --port={port} --IdentityProvider.token={token} --allow-root"
    proc = subprocess.Popen(["make", "-s", "lab", f"LAB_ARGS={args}"], cwd=J.ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        status, body = J.wait_http(f"http://127.0.0.1:{port}/api/contents/lessons/index.ipynb?token={token}", 120)
        assert status == 200
        content = json.loads(body)["content"]
        assert "Parallelism from Scratch" in content["cells"][1]["source"]
        status, page = J.wait_http(f"http://127.0.0.1:{port}/lab/tree/lessons/index.ipynb?token={token}")
        assert status == 200 and b"JupyterLab" in page
    finally:
        import os
        import signal
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
