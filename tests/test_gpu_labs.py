"""Every GPU lab runs on the CPU with gloo, with 2 and 4 processes, in float64 and float32,
on one-axis and two-axis meshes; fails, with a message, when a piece of its result or of
its trace is wrong or missing (in bfloat16 too); and issues the same calls as the lesson's
algorithm on the emulator (its options, bfloat16 and one rank: tests/test_gpu_lab_options.py).
Each lab's 4-process float32 run is launched by torchrun, the rest by the tests' forked
launcher (:mod:`tests._launch`: the same ranks and environment)."""

import numpy as np
import pytest

from emulator import World, nn
from emulator.records import calls
from emulator.algorithms.p2p_ring import ring_all_reduce_p2p
from emulator.parallel import data_parallel
from emulator.parallel.tp_block import TensorParallelBlock
from emulator.training import synthetic_batches, train

from tests import _launch

pytestmark = pytest.mark.slow
TORCHRUN_CASE = (4, "float32")  # the run of each lab that torchrun itself launches: a GPU user's dtype


def torchrun(n, lab, *flags):
    """``lab`` as ``torchrun -m gpu_labs.<lab>`` runs it, from the course's folder."""
    return _launch.torchrun(n, f"gpu_labs.{lab}", *flags)


def forked(n, lab, *flags):
    """The same ranks, forked from one process that imported torch once (:mod:`tests._launch`)."""
    return _launch.forked(n, f"gpu_labs.{lab}", *flags)


def launch(n, dtype):
    return torchrun if (n, dtype) == TORCHRUN_CASE else forked


def same_calls(lab_file, world):
    differ = calls.compare(calls.load(lab_file), world.calls, ("lab", "emulator"))
    assert not differ, "\n".join(differ)


@pytest.mark.parametrize("n", [2, 4])
def test_collectives_lab(n, tmp_path):
    launch_n = torchrun if n == 4 else forked
    out = launch_n(n, "00_collectives", "--sizes", "1e3,1e5", "--iters", "2", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"# {n} ranks, backend gloo" in out.stdout
    rows = [line.split() for line in out.stdout.splitlines() if line.strip().startswith(("all_", "reduce_"))]
    assert [r[0] for r in rows] == ["all_reduce"] * 2 + ["reduce_scatter"] * 2 + ["all_gather"] * 2
    assert all(float(r[2]) > 0 and float(r[5]) > 0 for r in rows)  # measured and predicted times
    assert "OK: ring all-reduce (batch_isend_irecv" in out.stdout
    world = World(n)  # the lesson's ring on the emulator, same size: the same calls, rank by rank
    world.run(lambda comm: ring_all_reduce_p2p(comm, np.zeros(64 * n)))
    same_calls(tmp_path / "00_collectives.calls.json", world)


# (lab, fault, the start of the message): for every lab a wrong value, a missing piece of the
# result (an output, a gradient, a parameter) and a missing call must each end the run
FAULTS = [
    ("00_collectives", "wrong-value", "ring all-reduce from point-to-point calls, against dist.all_reduce, on "
                                      "rank 1: result differs by"),
    ("00_collectives", "drop-output", "ring all-reduce from point-to-point calls, against dist.all_reduce, on "
                                      "rank 1: result has shape"),
    ("00_collectives", "drop-call", "the ring all-reduce: the calls differ from the emulator's: rank 1: emulator "
                                    "made 1 more calls"),
    ("01_data_parallel", "wrong-gradient", "hand-written ZeRO-1: parameters differ from the single-process run "
                                           "on rank 0"),
    ("01_data_parallel", "drop-parameter", "hand-written ZeRO-1: parameters differ from the single-process run "
                                           "on rank 0: blocks.0.attn.k.b is missing"),
    ("01_data_parallel", "drop-call", "ZeRO-1: the calls differ from the emulator's: rank 0"),
    ("02_tensor_parallel", "drop-gradient", "by hand on rank 1: grad mlp.fc1.w is None"),
    ("02_tensor_parallel", "wrong-output", "by hand on rank 1: output differs by"),
    ("02_tensor_parallel", "drop-call", "by hand: the calls differ from the emulator's: rank 1"),
    ("03_pipeline", "drop-gradient", "1F1B by hand: the gradients on rank 1:"),
    ("03_pipeline", "wrong-gradient", "1F1B by hand: the gradients on rank 1:"),
    ("03_pipeline", "drop-call", "1F1B by hand: the calls differ from the emulator's: rank 1"),
    ("04_context_parallel", "drop-gradient", "ring attention (causal, zigzag), against attention on the whole "
                                             "sequence, on rank 1: dk is None"),
    ("04_context_parallel", "wrong-output", "ring attention (causal, zigzag), against attention on the whole "
                                            "sequence, on rank 1: output differs by"),
    ("04_context_parallel", "drop-call", "ring attention, causal, zigzag: the calls differ from the emulator's"),
    ("05_expert_parallel", "drop-gradient", "expert parallel layer, against the dense layer, on rank 1: gradient "
                                            "of experts.fc1.w is None"),
    ("05_expert_parallel", "wrong-output", "expert parallel layer, against the dense layer, on rank 1: output "
                                           "differs by"),
    ("05_expert_parallel", "drop-call", "expert parallel: the calls differ from the emulator's: rank 1"),
]
FAST = {"00_collectives": ["--sizes", "1e3", "--iters", "1"], "01_data_parallel": ["--steps", "1"],
        "03_pipeline": ["--steps", "1"]}


@pytest.mark.parametrize("lab,fault,message", FAULTS, ids=[f"{l[:2]}-{f}" for l, f, _ in FAULTS])
def test_lab_fails_when_a_piece_is_wrong_or_missing(lab, fault, message, tmp_path):
    out = forked(2, lab, "--self-test-fault", fault, "--out", str(tmp_path),
                   *FAST.get(lab, ["--iters", "1"]))
    assert out.returncode != 0, out.stdout[-2000:]
    failed = [line for line in out.stderr.splitlines() if line.startswith("FAILED on rank")]
    assert failed and any(message in line for line in failed), failed or out.stderr[-3000:]
    assert "OK:" not in out.stdout


V, D, H, FF, L, S = 16, 32, 2, 64, 2, 16


@pytest.mark.parametrize("n,dtype", [(2, "float64"), (4, "float64"), (2, "float32"), (4, "float32")])
def test_data_parallel_lab(n, dtype, tmp_path):
    out = launch(n, dtype)(n, "01_data_parallel", "--steps", "2", "--dtype", dtype, "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line.split() for line in out.stdout.splitlines()
             if line.strip().startswith(("DDP", "ZeRO-", "torch", "FSDP2")) and ": its " not in line]
    per_rank = [l for l in lines if l[0] in ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")]
    assert len(per_rank) == 4 * n and {l[1] for l in per_rank} == {str(r) for r in range(n)}
    assert {l[0] for l in lines} == {"DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "torch", "FSDP2"}
    rows = {l[0]: l for l in per_rank if l[1] == "0"}
    # held bytes fall stage by stage; ZeRO-3 sends 1.5x what DDP sends
    grads = [int(rows[s][4].replace(",", "")) for s in ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")]
    assert grads[0] == grads[1] > grads[2] == grads[3]
    sent = {s: float(rows[s][6].replace(",", "")) for s in ("DDP", "ZeRO-3")}
    assert sent["ZeRO-3"] == pytest.approx(1.5 * sent["DDP"], rel=0.01)
    assert "OK: every variant matches the single-process run" in out.stdout
    for variant in ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"):  # the lab compared its own calls too
        assert f"{variant}: its " in out.stdout and "are the emulator's, call for call" in out.stdout
    # one algorithm, two backends: the lab issued exactly the emulator's calls
    np_dtype = np.float64 if dtype == "float64" else np.float32
    model = nn.GPT(V, D, H, FF, L, S, dtype=np_dtype)
    params = {k: v.astype(np_dtype) for k, v in nn.GPT(V, D, H, FF, L, S, dtype=np.float64).init(
        np.random.default_rng(0)).items()}
    batches = synthetic_batches(2, 8, S, V, seed=1)
    for zero_stage in range(4):
        world = World(mesh={"dp": n})
        world.run(lambda c: train(c, model, data_parallel(zero_stage, c.group("dp"), model, params, nn.AdamW()),
                                  batches))
        same_calls(tmp_path / f"01_data_parallel.zero{zero_stage}.calls.json", world)


@pytest.mark.parametrize("dtype,fault", [("float32", "wrong-gradient"), ("bfloat16", "drop-parameter")])
def test_data_parallel_lab_fails_loudly_in_lower_precision(dtype, fault, tmp_path):
    """float32 still sees one wrong gradient element; in bf16, whose tolerance is above
    what one element's wrong Adam step can move a parameter, a missing parameter."""
    out = forked(2, "01_data_parallel", "--steps", "1", "--self-test-fault", fault, "--dtype", dtype, "--out",
                   str(tmp_path))
    assert out.returncode != 0
    assert "hand-written ZeRO-1: parameters differ from the single-process run" in out.stderr


def test_calls_comparison_bites():
    a = [[calls.Call("all_reduce", "dp", 16), calls.Call("all_gather", "dp", 8)]]
    assert calls.compare(a, a) == []
    b = [[calls.Call("all_reduce", "dp", 16), calls.Call("all_gather", "tp", 8)]]
    assert "call #1" in calls.compare(a, b)[0]
    assert "1 more calls" in calls.compare(a, [a[0][:1]])[0]


@pytest.mark.parametrize("n,dtype", [(2, "float64"), (4, "float64"), (2, "float32"), (4, "float32")])
def test_tensor_parallel_lab(n, dtype, tmp_path):
    out = launch(n, dtype)(n, "02_tensor_parallel", "--dtype", dtype, "--iters", "2", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    for name in ("by hand", "by hand, SP", "DTensor", "DTensor, SequenceParallel"):
        assert f"{name}: output, input gradient and 16 parameter gradients match" in out.stdout, out.stdout
    assert "OK: the hand-written TP and SP blocks and DTensor's match" in out.stdout
    np_dtype = np.float64 if dtype == "float64" else np.float32
    d, a, ff, b, s = 64, 8, 256, 2, 16
    params = {k: v.astype(np_dtype) for k, v in nn.TransformerBlock(d, a, ff, dtype=np.float64).init(
        np.random.default_rng(0)).items()}
    x = np.zeros((b, s, d), np_dtype)
    for sp in (False, True):  # the emulator's block, same shapes: the same calls, rank by rank
        def prog(comm):
            tp = comm.group("tp")
            tb = TensorParallelBlock(tp, d, a, ff, sequence_parallel=sp, act_dtype=np_dtype)
            p = tb.shard(params)
            xl = x[:, :s // n] if sp else x
            y, cache = tb.forward(p, xl)
            tb.backward(p, cache, np.ones_like(y))

        world = World(mesh={"tp": n})
        world.run(prog)
        same_calls(tmp_path / f"02_tensor_parallel.{'sp' if sp else 'tp'}.calls.json", world)


@pytest.mark.parametrize("n,dtype", [(2, "float64"), (4, "float64"), (2, "float32"), (4, "float32")])
def test_pipeline_lab(n, dtype, tmp_path):
    from emulator.parallel import pipeline as pp

    out = launch(n, dtype)(n, "03_pipeline", "--dtype", dtype, "--steps", "1", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    for name in ("1F1B by hand", "ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B"):
        assert f"{name}: loss and all " in out.stdout and "gradients match one process" in out.stdout, out.stdout
        assert f"{name}: its " in out.stdout, out.stdout  # its calls compared with the emulator's
    bubble = next(line for line in out.stdout.splitlines() if line.startswith("bubble of 1F1B by hand"))
    measured, emulated = (float(part.split()[-1].rstrip("%")) for part in bubble.split("|")[:2])
    assert 0 < emulated <= measured < 100
    np_dtype = np.float64 if dtype == "float64" else np.float32
    m = 2 * n  # the lab's model and batch, on the emulator's executor: the same calls, rank by rank
    model = nn.GPT(vocab=32, d_model=32, n_heads=4, d_ff=64, n_layers=2 * n, max_seq=16, dtype=np_dtype)
    x = np.zeros((2 * m, 16), dtype=np.int64)
    world = World(n)
    pp.run(world, model, model.init(np.random.default_rng(0)), pp.schedule("1f1b", n, m), x, x)
    same_calls(tmp_path / "03_pipeline.calls.json", world)


@pytest.mark.parametrize("n,dtype", [(2, "float64"), (4, "float64"), (2, "float32"), (4, "float32")])
def test_context_parallel_lab(n, dtype, tmp_path):
    from emulator.parallel import context_parallel as cp

    out = launch(n, dtype)(n, "04_context_parallel", "--dtype", dtype, "--iters", "1", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    for case in ("full, contiguous", "full, zigzag", "causal, contiguous", "causal, zigzag"):
        assert f"ring attention, {case}: output, dq, dk, dv match the whole-sequence attention" in out.stdout
    assert "of the shorter one hidden | emulator's model of one step" in out.stdout
    np_dtype = np.float64 if dtype == "float64" else np.float32
    x = np.zeros((2, 4, 16, 8), np_dtype)  # the lab's shard shape: the same calls, rank by rank

    def prog(comm):
        o, cache = cp.ring_attention(comm, x, x, x, causal=True, layout="zigzag")
        cp.ring_attention_backward(comm, cache, o)

    world = World(n)
    world.run(prog)
    same_calls(tmp_path / "04_context_parallel.calls.json", world)


@pytest.mark.parametrize("n,dtype", [(2, "float64"), (4, "float64"), (2, "float32"), (4, "float32")])
def test_expert_parallel_lab(n, dtype, tmp_path):
    from emulator.parallel import expert_parallel as ep

    out = launch(n, dtype)(n, "05_expert_parallel", "--dtype", dtype, "--iters", "1", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"expert parallel, dp 1 x ep {n}: output, input gradient and 5 parameter gradients match" in out.stdout
    assert "(median, slowest rank, no expert compute inside) | emulator's model on H100/H200 NVLink" in out.stdout
    np_dtype = np.float64 if dtype == "float64" else np.float32
    moe = nn.MoE(16, 32, 8, 2, dtype=np_dtype)  # the lab's layer and tokens: the same calls, rank by rank
    p = moe.init(np.random.default_rng(0))
    p["router.w"] = (p["router.w"] * 40).astype(np_dtype)
    rng = np.random.default_rng(1)
    x, dy = (rng.standard_normal((n * 12, 16)).astype(np_dtype) for _ in range(2))

    def prog(comm):
        g = comm.group("ep")
        local = ep.shard_experts(p, n, g.rank)
        y, cache = ep.forward(g, moe, local, np.split(x, n)[comm.rank])
        ep.backward(g, moe, local, cache, np.split(dy, n)[comm.rank])

    world = World(mesh={"dp": 1, "ep": n})
    world.run(prog)
    same_calls(tmp_path / "05_expert_parallel.calls.json", world)


@pytest.mark.parametrize("lab,flag,shape", [("02_tensor_parallel", "--tp", "dp 2 x tp 2"),
                                            ("05_expert_parallel", "--ep", "dp 2 x ep 2")])
def test_two_axis_mesh(lab, flag, shape, tmp_path):
    """More ranks than one TP/EP group: TP or EP inside the node, DP across (here 2 x 2)."""
    out = forked(4, lab, flag, "2", "--iters", "1", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"# 4 ranks as {shape}" in out.stdout
    assert "the emulator's, call for call" in out.stdout and "OK:" in out.stdout
