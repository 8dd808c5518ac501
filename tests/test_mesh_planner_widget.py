"""The mesh planner widgets driven headlessly: set a control, read what it shows."""

import pytest

from emulator.widgets import MeshPlanner, PlanExplorer, mesh_planner_model, plan_explorer_model
from emulator.widgets.mesh_planner import run_chosen


def test_mesh_planner_model():
    ok = mesh_planner_model(gpus=64, gpus_per_node=8, n_params=70e9, layers=80, dp=4, tp=8, pp=2)
    assert ok["ok"] and not ok["red"] and ok["state"] == pytest.approx(16 * 70e9 / 64)
    assert ok["bubble"] == pytest.approx(1 / 9) and "TP 8 on NVLink" in ok["text"]
    red = mesh_planner_model(gpus=64, gpus_per_node=8, n_params=70e9, layers=80, dp=2, tp=16, pp=2)
    assert red["red"] and not red["ok"] and "passes the 8 GPUs of a node" in red["text"]
    assert red["state"] == ok["state"]  # (b): the state depends only on DP x TP x PP
    deeper = mesh_planner_model(gpus=64, gpus_per_node=8, n_params=70e9, layers=80, dp=2, tp=8, pp=4)
    assert deeper["state"] == ok["state"] and deeper["bubble"] > ok["bubble"]
    wrong = mesh_planner_model(gpus=64, dp=4, tp=8, pp=4)
    assert not wrong["ok"] and "not the 64 GPUs" in wrong["text"]
    big = mesh_planner_model(gpus=8, n_params=70e9, dp=1, tp=8, pp=1)
    assert not big["fits"] and "exceeds 80 GB" in big["text"]


def test_mesh_planner_widget_follows_its_controls():
    w = MeshPlanner()
    first, image = w.summary.value, w.image.value
    assert first.startswith("<p class='mesh-summary'>OK") and image[:4] == b"\x89PNG"
    w.tp.value = 16
    assert "INVALID" in w.summary.value and "passes the 8 GPUs" in w.summary.value
    w.dp.value = 2
    assert "INVALID" in w.summary.value and "not the 64 GPUs" not in w.summary.value
    w.tp.value, w.pp.value = 8, 4
    assert w.summary.value.startswith("<p class='mesh-summary'>OK") and w.image.value != image


def test_plan_explorer_model_and_widget():
    state = plan_explorer_model(model="llama3-8b", nodes=1, seq_len=2048, batch_tokens=2**18, dp=2, tp=2, pp=2,
                                micro_batches=16, top=3)
    assert state["estimate"].valid and 1 <= len(state["ranked"]) <= 3 and "best plans found" in state["text"]
    w = PlanExplorer(model="llama3-8b", nodes=1, seq_len=2048, batch_tokens=2**18, dp=2, tp=2, pp=2,
                     micro_batches=16)
    before = w.summary.value
    assert "tokens/s per GPU" in before
    w.axes["tp"].value = 4
    assert "but the cluster has 8" in w.summary.value  # 2 x 4 x 2 = 16 GPUs on one node of 8
    w.axes["dp"].value = 1
    assert "tokens/s per GPU" in w.summary.value and w.summary.value != before
    w.schedule.value = "interleaved_1f1b"  # v=1 with the interleaved schedule: refused, said in the text
    assert "interleaved schedule needs v >= 2" in w.summary.value
    w.v.value = 2
    assert "tokens/s per GPU" in w.summary.value


def test_plan_explorer_runs_its_plan_on_the_emulator():
    state = plan_explorer_model(model="llama3-8b", nodes=1, seq_len=1024, batch_tokens=2**14, dp=2, tp=2, pp=2,
                                micro_batches=4, top=1)
    text, fig = run_chosen(state)
    assert text.startswith("ran on the emulator") and "step time" in text and fig is not None
    too_big = plan_explorer_model(model="llama3-70b", nodes=16, seq_len=4096, batch_tokens=2**21, dp=8, tp=8, pp=2,
                                  micro_batches=16, top=1)
    text, fig = run_chosen(too_big)
    assert "too many to run from a widget" in text and fig is None


def test_mesh_planner_says_it_fixes_the_micro_batches():
    out = mesh_planner_model(gpus=64, gpus_per_node=8, n_params=70e9, layers=80, dp=2, tp=8, pp=4)
    assert "m = 16 micro-batches (this planner fixes m at 4 x PP)" in out["text"]
    assert out["bubble"] == pytest.approx(3 / 19)


def test_plan_explorer_run_button_refuses_an_invalid_plan_and_keeps_the_last_result(monkeypatch):
    """An invalid plan's run says why in the widget (no ConfigError from the callback) and
    leaves the previous run's text and picture; a valid run says it is running while it runs."""
    import emulator.widgets.mesh_planner as mp

    w = PlanExplorer(model="llama3-8b", nodes=1, seq_len=1024, batch_tokens=2**14, dp=2, tp=2, pp=2,
                     micro_batches=4)
    seen = []
    real = mp.run_chosen

    def watched(state):
        seen.append((w.status.value, w.run.disabled))
        return real(state)

    monkeypatch.setattr(mp, "run_chosen", watched)
    w._run()
    assert "running" in seen[0][0] and seen[0][1]  # said, and the button held, while it ran
    assert "done in" in w.status.value and not w.run.disabled
    ran, picture = w.ran.value, w.ran_image.value
    assert ran.startswith("<p class='plan-run'>ran on the emulator") and picture[:4] == b"\x89PNG"
    w.axes["tp"].value = 4  # 2 x 4 x 2 = 16 GPUs on one node of 8
    w._run()
    assert "cannot run this plan" in w.status.value and "but the cluster has 8" in w.status.value
    assert w.ran.value == ran and w.ran_image.value == picture and not w.run.disabled


def test_run_chosen_turns_a_refused_plan_into_its_reason():
    bad = plan_explorer_model(model="llama3-8b", nodes=1, seq_len=1024, batch_tokens=2**14, dp=2, tp=4, pp=2,
                              micro_batches=4, top=1)
    text, fig = run_chosen(bad)
    assert text.startswith("cannot run this plan") and "but the cluster has 8" in text and fig is None


def test_plan_explorer_shows_where_the_step_goes_under_the_chosen_stack():
    args = dict(model="llama3-8b", nodes=1, seq_len=2048, batch_tokens=2**18, dp=2, tp=2, pp=2, micro_batches=16,
                top=1)
    core, eager = (plan_explorer_model(**args, stack=s) for s in ("megatron-core", "pytorch-eager"))
    assert core["text"].startswith("megatron-core: step") and eager["text"].startswith("pytorch-eager: step")
    assert eager["estimate"].step_time > core["estimate"].step_time  # every op its own kernel, launched by the host
    bar = core["figure"].axes[1]
    drawn = sum(p.get_width() for p in bar.patches)
    assert drawn == pytest.approx(core["estimate"].step_time, rel=1e-9)  # the whole step, part by part
    labels = [t.get_text() for t in bar.get_legend().get_texts()]
    assert any(t.startswith("GEMMs") for t in labels) and any(t.startswith("bubble") for t in labels)
    w = PlanExplorer(model="llama3-8b", nodes=1, seq_len=2048, batch_tokens=2**18, dp=2, tp=2, pp=2,
                     micro_batches=16)
    w.stack.value = "pytorch-eager"
    assert w.summary.value.count("pytorch-eager: step") == 1 and w.state["stack"] == "pytorch-eager"
