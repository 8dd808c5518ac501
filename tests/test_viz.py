"""The pictures the lessons draw: what each one shows must be what the emulator measured."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from emulator import World, viz  # noqa: E402
from emulator.parallel.pipeline import schedule  # noqa: E402
from emulator.parallel.pipeline.check import bubble_of, simulate  # noqa: E402
from emulator.viz.schedules import schedule_grid  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def two_groups():
    """tp and dp all-reduces in flight at once, then some compute."""
    def prog(comm):
        a = comm.group("tp").all_reduce(np.ones(1 << 14), async_op=True)
        b = comm.group("dp").all_reduce(np.ones(1 << 16), async_op=True)
        comm.compute(flops=1e9, name="layer")
        a.wait(), b.wait()

    world = World(mesh={"dp": 2, "tp": 2})
    world.run(prog)
    return world


def legend_labels(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_gantt_has_a_lane_per_rank_and_stream_and_a_bar_per_event():
    world = two_groups()
    tl = world.timeline()
    ax = viz.gantt(tl).axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels.count("rank 0") == 1 and labels.count("comm tp") == 4 and labels.count("comm dp") == 4
    bars = [c for c in ax.collections if len(c.get_paths())]
    drawn = sorted((round(p.get_extents().x0, 9), round(p.get_extents().width, 9)) for c in bars for p in c.get_paths())
    events = sorted((round(e.start * 1e3, 9), round(e.duration * 1e3, 9)) for e in tl.events)
    assert drawn == events  # every event, at its time (ms), and nothing else
    assert ax.get_xlim()[1] == pytest.approx(tl.makespan * 1e3)
    assert "comm" in legend_labels(ax)


def test_gantt_streams_filter_and_legend():
    world = two_groups()
    only_dp = viz.gantt(world, streams=("comm dp",)).axes[0]
    assert {t.get_text() for t in only_dp.get_yticklabels()} == {f"rank {r}" for r in range(4)} | {"comm dp"}
    bare = viz.gantt(world, streams=()).axes[0]
    assert [t.get_text() for t in bare.get_yticklabels()] == [f"rank {r}" for r in range(4)]
    assert "comm" not in legend_labels(bare)  # no lane of that colour, no legend entry


def test_gantt_colours_compute_by_name():
    world = World(1)
    world.run(lambda comm: (comm.compute(flops=1e9, name="F0"), comm.compute(flops=1e9, name="B0")))
    ax = viz.gantt(world, colors={"F": "#112233", "B": "#445566"}).axes[0]
    faces = [tuple(np.round(c.get_facecolor()[0][:3], 3)) for c in ax.collections if len(c.get_paths())]
    assert faces == [tuple(np.round(matplotlib.colors.to_rgb(x), 3)) for x in ("#112233", "#445566")]
    assert legend_labels(ax)[:2] == ["F", "B"]


def test_gantt_colours_compute_by_pass_with_kind_of():
    """Kernels named by module ("MLP in", "MLP in backward", "MLP weight gradients") get the
    colour of their pass; without kind_of the first letter decides and all three are "M"."""
    world = World(1)
    world.run(lambda comm: [comm.compute(flops=1e9, name=n) for n in ("MLP in", "MLP in backward",
                                                                       "MLP weight gradients")])
    ax = viz.gantt(world, colors=viz.PASS_COLORS, kind_of=viz.training_pass).axes[0]
    faces = [tuple(np.round(c.get_facecolor()[0][:3], 3)) for c in ax.collections if len(c.get_paths())]
    assert faces == [tuple(np.round(matplotlib.colors.to_rgb(x), 3)) for x in viz.PASS_COLORS.values()]
    assert legend_labels(ax)[:3] == ["forward", "backward", "weight gradients"]
    plain = viz.gantt(world, colors=viz.PASS_COLORS).axes[0]  # "M" is no key: the default compute colour
    assert len([c for c in plain.collections if len(c.get_paths())]) == 1


def test_memory_over_time_marks_the_ledgers_peak():
    def prog(comm):
        comm.memory.hold("w", np.zeros(1000), "params")
        comm.compute(flops=1e6)
        comm.memory.hold("a", np.zeros(3000), "activations")
        comm.compute(flops=1e6)
        comm.memory.release("a")
        comm.compute(flops=1e6)

    world = World(1)
    world.run(prog)
    led = world.memory[0]
    ax = viz.memory_over_time(led).axes[0]
    (marker,) = [line for line in ax.lines if line.get_marker() == "v"]
    assert marker.get_ydata()[0] == pytest.approx(led.peak / 1e3) == pytest.approx(32.0)
    labels = legend_labels(ax)
    assert "params (8.0 at peak)" in labels and "activations (24.0 at peak)" in labels


def test_schedule_grid_draws_every_action_and_titles_the_bubble():
    s = schedule("1f1b", 4, 6)
    fig = schedule_grid(s)
    ax = fig.axes[0]
    n_bars = sum(len(c.get_paths()) for c in ax.collections)
    assert n_bars == sum(len(acts) for acts in s)
    assert ax.get_title() == f"bubble {bubble_of(simulate(s, (1, 1, 1))):.1%}" == "bubble 33.3%"


def test_gantt_draws_a_lane_colour_as_one_collection():
    """Thousands of events (a checkpointed run's layer by layer kernels) draw in a fraction of
    a second: one collection per lane and colour, not one per event."""
    world = World(2)
    world.run(lambda comm: [comm.compute(seconds=1e-6, name="k") for _ in range(500)] and comm.all_reduce(np.ones(4)))
    tl = world.timeline()
    ax = viz.gantt(tl).axes[0]
    bars = [c for c in ax.collections if len(c.get_paths())]
    assert sum(len(c.get_paths()) for c in bars) == len(tl.events)
    assert len(bars) <= 2 * 3  # per rank: compute, idle, and the comm lane
