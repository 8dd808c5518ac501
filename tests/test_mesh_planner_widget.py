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
