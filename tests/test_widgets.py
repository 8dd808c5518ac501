"""Widgets driven headlessly: set a control's value, read the result."""

import pytest

from emulator.widgets import RingStepper, ring_stepper_model


def test_ring_stepper_model():
    start = ring_stepper_model(4, 0)
    assert start["total_steps"] == 6 and start["complete"] == 0 and start["sends"] == []
    mid = ring_stepper_model(4, 3)
    assert mid["phase"] == "reduce-scatter" and mid["complete"] == 4  # each rank owns one full chunk
    assert mid["sends"] == [(0, 1, 1), (1, 2, 2), (2, 3, 3), (3, 0, 0)]
    end = ring_stepper_model(4, 6)
    assert end["complete"] == 16 and end["bytes_sent"] == [6, 6, 6, 6]
    assert ring_stepper_model(5, 4, "reduce_scatter")["complete"] == 5
    assert ring_stepper_model(3, 2, "all_gather")["complete"] == 9
    with pytest.raises(ValueError, match="step must be between 0 and 6"):
        ring_stepper_model(4, 7)


def test_ring_stepper_widget_follows_its_controls():
    w = RingStepper(n=4)
    first_caption, first_image = w.caption.value, w.image.value
    assert "Step 0" in first_caption and first_image[:4] == b"\x89PNG"
    w.step.value = 2
    assert "step 2 of 6" in w.caption.value and w.image.value != first_image
    w.ranks.value = 8
    assert w.step.max == 14 and "of 14" in w.caption.value
    w.collective.value = "all_gather"
    assert w.step.max == 7 and w.step.value == 2 and "all-gather" in w.caption.value


def test_zero_explorer_model_and_widget():
    from emulator.widgets import ZeroExplorer, zero_explorer_model

    m = zero_explorer_model(30e9, 16, 2)
    assert m["bytes"][2]["total"] == 86.25e9 and not m["fits"] and "does not fit" in m["text"]
    assert zero_explorer_model(30e9, 16, 3)["fits"]
    w = ZeroExplorer(n_params=7.5e9, dp_size=64, zero_stage=0)
    assert "DDP on 64 GPUs: 120 GB" in w.summary.value
    image = w.image.value
    w.zero_stage.value = 3
    assert "ZeRO-3 on 64 GPUs: 1.875 GB" in w.summary.value and w.image.value != image
    w.gpus.value, w.params.value = 16, 70e9
    assert "70 GB per GPU" in w.summary.value and "fits in 80 GB" in w.summary.value
    assert 30e9 not in [v for _, v in w.params.options]  # Problem 8.1's model size is not a preset


def test_activation_explorer_model_and_widget():
    from emulator.accounting import activation_bytes_per_layer
    from emulator.widgets import ActivationExplorer, activation_explorer_model

    m = activation_explorer_model(4096, 1, 12288, 96, t=8, layers=96, sp=True, recompute="selective")
    assert m["total"] == 96 * activation_bytes_per_layer(4096, 1, 12288, 96, 8, True, "selective")
    assert m["measured"] is None and m["fits"] and "20.54 GB" in m["text"]
    small = activation_explorer_model(128, 1, 64, 4, t=2, layers=12, sp=True)
    assert small["measured"] == {k: int(v) for k, v in small["terms"].items()}  # the emulator agrees
    w = ActivationExplorer(s=128, b=1, h=64, a=4, t=2, layers=12)
    before, image = w.summary.value, w.image.value
    w.sp.value = True
    assert w.summary.value != before and w.image.value != image and "measured on the emulator" in w.summary.value
    w.a.value = 96  # 64 is not divisible by 96 heads: said in the widget, not raised
    assert "divisible" in w.summary.value


def test_schedule_explorer_model_and_widget():
    from emulator.accounting import pipeline_bubble
    from emulator.widgets import ScheduleExplorer, schedule_explorer_model

    m = schedule_explorer_model("1f1b", 4, 8)
    assert m["bubble"] == pytest.approx(pipeline_bubble(4, 8), abs=1e-9)
    assert m["formula"] == pipeline_bubble(4, 8)
    assert m["held"] == [4, 3, 2, 1] == m["predicted"]  # measured from the ledger, and the schedule's count
    z = schedule_explorer_model("zb_h1", 4, 8, ratio=(1, 1, 1))
    assert z["bubble"] == pytest.approx(pipeline_bubble(4, 8, schedule="zb_h1"), abs=1e-9)
    assert z["bubble"] < m["bubble"]
    assert schedule_explorer_model("zb_h1", 4, 8, ratio=(1, 1, 2))["formula"] is None  # W > B: no formula, said
    w = ScheduleExplorer("1f1b", p=4, m=8)
    before, image = w.summary.value, w.image.value
    w.schedule.value = "gpipe"
    assert w.summary.value != before and w.image.value != image and "8, 8, 8, 8" in w.summary.value
    w.schedule.value = "interleaved_1f1b"  # v is still 1: said in the widget, not raised
    assert "needs v >= 2" in w.summary.value
    w.v.value = 2
    assert "measured bubble 15.79%; formula 15.79%" in w.summary.value


def test_ring_attention_stepper_model_and_widget():
    from emulator.widgets import RingAttentionStepper, ring_attention_stepper_model

    contiguous = ring_attention_stepper_model(4, True, "contiguous", 3)
    assert contiguous["work"].tolist() == [4, 8, 12, 16]  # the last rank does c times the first's work
    assert ring_attention_stepper_model(4, True, "zigzag", 3)["work"].tolist() == [9, 9, 9, 9]  # 2c + 1 each
    assert ring_attention_stepper_model(4, False, "zigzag", 3)["work"].tolist() == [16] * 4
    assert contiguous["holds"] == [1, 2, 3, 0]  # at step 3 rank r holds the K/V of rank r - 3
    first = ring_attention_stepper_model(4, True, "contiguous", 0)
    assert (first["owner"] >= 0).sum() == 4 * 4  # step 0: each rank's own diagonal block (2 x 2 pieces)
    w = RingAttentionStepper(c=4, causal=True, layout="contiguous", step=0)
    before, image = w.caption.value, w.image.value
    w.step.value = 2
    assert w.caption.value != before and w.image.value != image and "step 2 of 3" in w.caption.value
    w.split.value = "zigzag"
    assert "Work so far per rank: 7, 7, 7, 7" in w.caption.value
    w.c.value = 2  # the step slider follows the ring's size
    assert w.step.max == 1 and "step 1 of 1" in w.caption.value


def test_routing_explorer_model_and_widget():
    from emulator.widgets import RoutingExplorer, routing_explorer_model

    even = routing_explorer_model(8, 2, 1.25, skew=0.0, ep_size=4)
    assert even["dropped"] == 0 and even["wanted"].sum() == 1024
    skewed = routing_explorer_model(8, 2, 1.25, skew=4.0, ep_size=4)
    assert skewed["wanted"].argmax() == 0 and skewed["dropped"] == (skewed["wanted"] - skewed["kept"]).sum() > 0
    assert skewed["kept"].max() <= skewed["capacity"] == 160
    assert routing_explorer_model(8, 2, None, skew=4.0, ep_size=4)["dropped"] == 0  # dropless
    assert routing_explorer_model(8, 2, 1.25, skew=1.0, ep_size=1)["bytes"] == [0]  # one rank: nothing travels
    w = RoutingExplorer(n_experts=8, top_k=2, capacity_factor=1.25, skew=1.0, ep=4)
    before, image = w.summary.value, w.image.value
    w.skew.value = 4.0
    assert w.summary.value != before and w.image.value != image and "276 of 1024" in w.summary.value
    w.n_experts.value = 4
    last, image = w.state, w.image.value
    w.ep.value = 8  # 4 experts over 8 ranks: said in the widget, not raised
    assert "do not split over EP 8" in w.summary.value
    assert w.state is last and w.image.value == image  # the last accepted picture stays


def test_failure_explorer_model_and_widget():
    from emulator.accounting import failures as F
    from emulator.widgets import FailureExplorer, failure_explorer_model

    llama = failure_explorer_model()
    assert llama["mtbf"] / 3600 == pytest.approx(3.09, abs=0.01)  # Llama 3's rate: 16,384 GPUs
    assert llama["best"] == pytest.approx(F.daly_interval(60, llama["mtbf"]), rel=0.01)
    assert llama["expected"] <= llama["at_best"] and "best interval is 18.6 min" in llama["text"]
    kinds = {s.kind for s in llama["spans"]}
    assert {"work", "save"} <= kinds and len(llama["failures"]) > 0
    bigger = failure_explorer_model(gpus=65536)
    assert bigger["mtbf"] == pytest.approx(llama["mtbf"] / 4) and bigger["at_best"] < llama["at_best"]
    asyn = failure_explorer_model(async_save=True)
    assert asyn["at_best"] > llama["at_best"] and "background" in asyn["text"]
    assert asyn["best"] >= 60  # no shorter than its background write
    w = FailureExplorer()
    before, image = w.summary.value, w.image.value
    w.interval.value = 60
    assert w.summary.value != before and w.image.value != image and "Saving every 60 min" in w.summary.value
    assert FailureExplorer(interval_minutes=25).interval.options[6] == 25  # a value not on the slider joins it
    w.async_save.value = True
    assert "asynchronous" in w.summary.value
    w.gpus.value = 131072
    assert "the job fails every 0.39 h" in w.summary.value
