"""What the calibrated devices charge for one transformer layer's kernels, beside the ideal
device (FLOPs at the peak), and the model beside every published figure it is fitted to.

    python -m benchmarks.device

Kernels: one Llama 3 405B layer on one tensor-parallel rank (TP8) for a micro-batch of one
8192-token sequence (d_model 16384, 128 query and 8 KV heads of dim 128, SwiGLU d_ff 53248:
Meta's llama-models, sku_list.py), in bf16. "% peak" is the share of the device's dense bf16
peak the kernel reaches; a memory-bound kernel shows the HBM bandwidth it reaches instead.
No GPU is involved: these are the model's numbers, and the second table is what makes them
credible.
"""

from emulator.machine import device_calibration as cal
from emulator.machine.device import Device
from emulator.machine.kernels import attention, gemm, memory_bound
from emulator.records.table import Table

TOKENS, D, HEADS, KV_HEADS, HEAD_DIM, D_FF, TP = 8192, 16384, 128, 8, 128, 53248, 8
QKV = (HEADS + 2 * KV_HEADS) * HEAD_DIM // TP  # 2304 columns of q, k, v per rank

FORWARD = (  # one layer's forward (residual adds and rotary embeddings left out)
    ("RMSNorm (read + write)", memory_bound(2 * TOKENS * D * 2)),
    ("q, k, v projection", gemm(TOKENS, QKV, D)),
    ("attention forward, causal", attention(1, HEADS // TP, TOKENS, TOKENS, HEAD_DIM, 2, 0.5)),
    ("output projection", gemm(TOKENS, D, HEADS * HEAD_DIM // TP)),
    ("RMSNorm (read + write)", memory_bound(2 * TOKENS * D * 2)),
    ("MLP gate and up", gemm(TOKENS, D_FF // TP, D, count=2)),
    ("SwiGLU (2 reads, 1 write)", memory_bound(3 * TOKENS * D_FF // TP * 2)),
    ("MLP down", gemm(TOKENS, D, D_FF // TP)),
)
BACKWARD_EXAMPLES = (
    ("attention backward, causal", attention(1, HEADS // TP, TOKENS, TOKENS, HEAD_DIM, 5, 0.5)),
    ("q, k, v weight gradient", gemm(D, QKV, TOKENS)),
)
DEVICES = (Device.h100(), Device.h200(), Device.a100())


def _row(name, ks, ideal):
    flops = sum(k.flops for k in ks)
    row = {"kernel": name, "GFLOP": f"{flops / 1e9:.0f}", "ideal H100 us": f"{sum(map(ideal.time, ks)) * 1e6:.0f}"}
    for dev in DEVICES:
        short, t = dev.name.split()[0], sum(map(dev.time, ks))
        row[f"{short} us"] = f"{t * 1e6:.0f}"
        memory = len(ks) == 1 and ks[0].kind == "memory"
        share = f"{ks[0].nbytes / t / 1e12:.2f} TB/s" if memory else f"{flops / t / dev.peak_flops:.0%}"
        row[f"{short} % peak"] = share
    return row


def layer_table():
    ideal = Device.ideal_device()
    rows = [_row(name, [k], ideal) for name, k in FORWARD]
    rows.append(_row("layer forward", [k for _, k in FORWARD], ideal))
    rows += [_row(name, [k], ideal) for name, k in BACKWARD_EXAMPLES]
    return Table(rows)


def citation_table():
    """The model beside each published figure (the check of tests/test_device.py)."""
    devs = {"H100": Device.h100(), "H200": Device.h200(), "A100": Device.a100()}
    rows = []
    for f in cal.PUBLISHED_GEMM:
        model = devs[f.device].achieved_flops(gemm(*f.shape)) / 1e12
        rows.append((f.device, "GEMM " + "x".join(map(str, f.shape)), f.tflops, model, "TFLOP/s", f.source))
    for f in cal.PUBLISHED_ATTENTION:
        ks = f.kernels()
        model = sum(k.flops for k in ks) / sum(devs[f.device].time(k) for k in ks) / 1e12
        kernel = " FA2" if f.kernel == "flash2" else ""
        what = f"attention{kernel} {f.passes} d{f.head_dim} s{f.seqlen}{' causal' if f.causal else ''}"
        rows.append((f.device, what, f.tflops, model, "TFLOP/s", f.source))
    for f in cal.PUBLISHED_HBM:
        rows.append((f.device, f.kernel, f.tbps, devs[f.device].achieved_hbm / 1e12, "TB/s", f.source))
    return Table([{"device": d, "kernel": w, "published": f"{p:g}", "model": f"{m:.3g}", "unit": u,
                   "error": f"{m / p - 1:+.1%}", "role": "table" if s == cal.XLA else "check", "source": s}
                  for d, w, p, m, u, s in rows])


def main():
    print("One Llama 3 405B layer per TP8 rank, micro-batch 1 x 8192 tokens, bf16:\n")
    print(layer_table())
    cite = citation_table()
    checks = [r for r in cite if r["role"] == "check"]
    worst = max(abs(float(r["error"].rstrip("%"))) for r in checks)
    print(f"\nThe model beside {len(cite)} published kernel figures. {len(cite) - len(checks)} rows (role "
          f"'table') are XLA's H100 GEMM sweep, which the model interpolates inside its grid, so they agree by "
          f"construction; the other {len(checks)} check it (worst error {worst:.1f}%, bound 10%):\n")
    print(cite)


if __name__ == "__main__":
    main()
