"""How tests/browser/test_jupyterlab.py drives each lesson's widgets in the page: the
keyboard on a slider, a pick in a dropdown, a tick in a checkbox, and the text each change
must bring (``DRIVERS``: the drivers of each lesson, by its notebook's stem)."""

import time


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
    # 70e9 parameters over 64 GPUs at 16 bytes each, as the lesson asks (the slider must not round the size)
    assert summary.inner_text().startswith("OK: state per GPU 17.50 GB"), summary.inner_text()
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
