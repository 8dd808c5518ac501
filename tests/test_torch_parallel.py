"""gpu_labs/torch_parallel: DDP and ShardedOptimizer on models other than the course GPT
(a toy MLP; a model with tied weights, a frozen parameter and a buffer), with gloo on the
CPU, against single-process training."""

import os
import socket

import pytest
import torch

pytestmark = pytest.mark.slow


class Tied(torch.nn.Module):
    """Embedding and output share a weight; a frozen projection; a buffer."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 8)
        self.frozen = torch.nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.mid = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 10, bias=False)
        self.out.weight = self.emb.weight  # tied
        self.register_buffer("scale", torch.tensor(1.0))

    def forward(self, idx):
        return self.out(torch.tanh(self.mid(self.frozen(self.emb(idx)))) * self.scale)


def make(kind, seed):
    torch.manual_seed(seed)
    if kind == "mlp":
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).double()
    return Tied().double()


def data(kind, steps=3, batch=8):
    g = torch.Generator().manual_seed(7)
    if kind == "mlp":
        return [(torch.randn(batch, 8, generator=g, dtype=torch.float64), torch.randn(batch, 4, generator=g,
                                                                                      dtype=torch.float64))
                for _ in range(steps)]
    return [(torch.randint(0, 10, (batch, 5), generator=g), torch.randint(0, 10, (batch, 5), generator=g))
            for _ in range(steps)]


def loss_of(kind, model, x, y):
    out = model(x)
    if kind == "mlp":
        return torch.nn.functional.mse_loss(out, y)
    return torch.nn.functional.cross_entropy(out.reshape(-1, 10), y.reshape(-1))


def reference(kind, opt_cls, **kw):
    model = make(kind, 0)
    opt = opt_cls(model.parameters(), **kw)
    for x, y in data(kind):
        opt.zero_grad()
        loss_of(kind, model, x, y).backward()
        opt.step()
    return model


def worker(rank, n, port, queue):
    import torch.distributed as dist

    from gpu_labs.torch_parallel.ddp import DDP
    from gpu_labs.torch_parallel.sharded_optimizer import ShardedOptimizer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    out = {}
    cases = [("mlp", None, "adamw"), ("mlp", 1e-9, "sharded adamw"), ("tied", None, "sharded adamw"),
             ("tied", 100, "sharded sgd, groups added later")]
    for kind, bucket, how in cases:
        module = make(kind, seed=rank)  # different on every rank: DDP must broadcast rank 0's
        if kind == "tied":
            module.scale.fill_(1.0 + rank)
        model = DDP(module, bucket_size_mb=bucket)
        params = [p for p in model.parameters() if p.requires_grad]
        if how == "adamw":
            opt = torch.optim.AdamW(params, lr=1e-2)
        elif how == "sharded adamw":
            opt = ShardedOptimizer(params, torch.optim.AdamW, lr=1e-2)
        else:
            opt = ShardedOptimizer(params[:1], torch.optim.SGD, lr=0.1, momentum=0.9)
            opt.add_param_group({"params": params[1:]})
        for x, y in data(kind):
            b = len(x) // n
            opt.zero_grad()
            loss_of(kind, model, x[rank * b:(rank + 1) * b], y[rank * b:(rank + 1) * b]).backward()
            model.finish_gradient_synchronization()
            opt.step()
        ref = reference(kind, torch.optim.AdamW if "adamw" in how else torch.optim.SGD,
                        **({"lr": 1e-2} if "adamw" in how else {"lr": 0.1, "momentum": 0.9}))
        err = max(float((a - b).abs().max()) for a, b in zip(model.module.state_dict().values(),
                                                             ref.state_dict().values()))
        state = opt.state_bytes() if isinstance(opt, ShardedOptimizer) else None
        full = sum(p.numel() * 8 * (2 if "adamw" in how else 1) for p in params)
        out[(kind, bucket, how)] = (err, state, full, len(model.buckets))
    queue.put((rank, out))
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("n", [2, 4])
def test_ddp_and_sharded_optimizer_train_like_one_process(n):
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, n, port, queue)) for r in range(n)]
    for p in procs:
        p.start()
    results = dict(queue.get() for _ in range(n))
    for p in procs:
        p.join(timeout=120)
    for case in results[0]:
        errs = [results[r][case][0] for r in range(n)]
        assert max(errs) < 1e-10, (case, errs)  # every rank ends with the single-process parameters
        state = [results[r][case][1] for r in range(n)]
        if state[0] is not None:  # ZeRO-1: the state is shared out, not replicated
            full = results[0][case][2]
            assert sum(state) == full and max(state) < full, (case, state, full)
    assert results[0][("mlp", 1e-9, "sharded adamw")][3] == 4  # a bucket per parameter
    # emb.weight (tied: once), mid.weight, mid.bias; the frozen projection is skipped
    assert results[0][("tied", None, "sharded adamw")][3] == 3


class _Toy(torch.nn.Module):
    """A model as outside test suites write them: a norm, a frozen parameter, no biases."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(10, 10, bias=False)
        self.ln = torch.nn.LayerNorm(10)
        self.fc2 = torch.nn.Linear(10, 50, bias=False)
        self.fc3 = torch.nn.Linear(50, 5, bias=False)
        self.no_grad_fixed_param = torch.nn.Parameter(torch.tensor([2.0, 2.0]), requires_grad=False)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(self.ln(torch.relu(self.fc1(x))))))


def harness_worker(rank, world_size, port, bucket_size_mb):
    """One rank, set up and torn down as an outside harness does it (torch.multiprocessing.spawn,
    its own init_process_group and destroy_process_group), training several models in a row
    with the DDP class and comparing each with one process."""
    import copy

    import torch.distributed as dist

    from gpu_labs.torch_parallel.ddp import DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    dist.barrier()
    torch.manual_seed(rank)  # every rank starts from different weights: DDP must broadcast rank 0's
    for _ in range(3):
        base = _Toy()
        ddp_model, single = DDP(copy.deepcopy(base), bucket_size_mb=bucket_size_mb), copy.deepcopy(base)
        for p in single.parameters():
            dist.broadcast(p.data, 0)
        opt, opt1 = torch.optim.SGD(ddp_model.parameters(), lr=0.1), torch.optim.SGD(single.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(5)
        for _ in range(4):
            x, y = torch.randn(20, 10, generator=g), torch.randn(20, 5, generator=g)
            opt.zero_grad()
            opt1.zero_grad()
            torch.nn.functional.mse_loss(ddp_model(x[rank::world_size]), y[rank::world_size]).backward()
            ddp_model.finish_gradient_synchronization()
            opt.step()
            # one process on the whole batch, split the same way (the mean of the ranks' means)
            sum(torch.nn.functional.mse_loss(single(x[r::world_size]), y[r::world_size])
                for r in range(world_size)).div(world_size).backward()
            opt1.step()
        for (name, a), b in zip(ddp_model.module.named_parameters(), single.parameters()):
            assert torch.allclose(a, b, atol=1e-6), (rank, name, float((a - b).abs().max()))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("bucket_size_mb", [None, 1e-4])
def test_ddp_driven_like_an_outside_harness(bucket_size_mb):
    """Spawned ranks with their own setup and teardown, several models in a row: every
    process must exit 0 (no rank aborting at exit) with the single-process weights."""
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(harness_worker, args=(2, free_port(), bucket_size_mb), nprocs=2, join=True)
