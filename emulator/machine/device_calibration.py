"""Published kernel measurements the calibrated devices (:mod:`emulator.machine.device`) are
fitted to, kept as data, and the fitted rates. Every figure below is a kernel timed alone on
one GPU; none is a training run's throughput (model FLOPs utilisation), which the planner
is checked against and so must not be fitted.

GEMM (TFLOP/s of dense 16-bit matrix products, C (m x n) = A (m x k) B (k x n)):

======  =====================  =========  =======  ==============================================
device  m x n x k              published  model    source
======  =====================  =========  =======  ==============================================
H100    2048 x 2048 x 13312    794.5      773      S. Bekman, ml-engineering [MAMF], BF16 table
H100    8192 x 8192 x 8192     795        775      pranjalssh/fast.cu README [cuBLAS], af9ce16
H100    4096 x 4096 x 4096     716        719      pranjalssh/fast.cu README [cuBLAS], af9ce16
H100    6144 x 6144 x 6144     741.1      757      pranjalssh/fast.cu README [cuBLAS], a1bb7b2
A100    1024 x 10240 x 5120    271.2      251      S. Bekman, ml-engineering [MAMF], BF16 table
A100    1024 x 1024 x 1024     119.4      110      Azure ND A100 v4 [cuBLASLt], FP16
A100    2048 x 2048 x 2048     221.8      203      Azure ND A100 v4 [cuBLASLt], FP16
A100    4096 x 4096 x 4096     228.0      246      Azure ND A100 v4 [cuBLASLt], FP16
A100    8192 x 8192 x 8192     253.7      264      Azure ND A100 v4 [cuBLASLt], FP16
A100    16384 x 16384 x 16384  256.5      272      Azure ND A100 v4 [cuBLASLt], FP16
A100    1024 x 2145 x 1024     132.8      140      Azure ND A100 v4 [cuBLASLt], FP16
A100    6144 x 12288 x 12288   250.8      269      Azure ND A100 v4 [cuBLASLt], FP16
A100    802816 x 192 x 768     157.8      168      Azure ND A100 v4 [cuBLASLt], FP16
======  =====================  =========  =======  ==============================================

Attention (TFLOP/s of FlashAttention kernels, FLOPs counted as the papers count them: 4 s^2 d h
per sequence forward, half that under a causal mask, 2.5 times the forward for the
backward; batch 16384/s sequences of length s, 2048/d heads of dim d, 16-bit inputs):

==========  =======  ===  ====  =======================  =======================  ====
device      pass     d    mask  published, s = 512..16k  model, same s            fig.
==========  =======  ===  ====  =======================  =======================  ====
H100 (FA3)  fwd      64   -     333 392 460 476 496 497  321 396 448 480 497 506  5a
H100 (FA3)  fwd      64   yes   197 265 371 420 460 473  185 271 353 416 457 480  5b
H100 (FA3)  fwd      128  -     467 565 625 638 646 648  465 550 605 637 654 663  5c
H100 (FA3)  fwd      128  yes   292 423 521 579 602 616  290 403 499 567 609 632  5d
H100 (FA3)  fwd      256  -     482 627 707 736 746 756  482 599 681 732 760 775  5e
H100 (FA3)  fwd      256  yes   286 427 537 612 628 642  286 405 511 588 636 663  5f
H100 (FA3)  bwd      64   -     272 363 422 453 472 474  276 354 413 450 472 483  6a
H100 (FA3)  bwd      128  -     316 424 501 542 559 561  320 415 487 534 561 575  6b
A100 (FA2)  fwd+bwd  64   -     132   . 162 171 175 176  131 150 163 169 173 175  4a
A100 (FA2)  fwd+bwd  128  -       .   . 187 196 201 203  145 170 186 196 201 203  4b
A100 (FA2)  fwd+bwd  64   yes    88 119 140 156 165 171   88 117 141 156 166 171  4c
A100 (FA2)  fwd+bwd  128  yes    99 133 155 173 182 189   98 130 156 172 182 187  4d
==========  =======  ===  ====  =======================  =======================  ====

(a dot: a value the figure's legend hides.)

HBM (TB/s of streaming kernels that read and write, against the datasheet's 3.35 TB/s on
H100 SXM, 4.8 on H200 SXM, 2.039 on A100 SXM 80 GB):

======  ===================================  =========  =====  =====================================
device  kernel                               published  model  source
======  ===================================  =========  =====  =====================================
H100    BabelStream Copy / Triad             2.90/2.97  2.98   Azure ND H100 v5 [HBM]
H100    torch.clone, bf16, 1 GiB             3.00       2.98   Dao-AILab/quack [clone]
H100    softmax, fp32, 16k x 131k            3.01       2.98   Dao-AILab/quack [softmax]
H200    BabelStream Copy / Triad             4.01/4.15  4.08   Azure ND H200 v5 [HBM]
A100    BabelStream Copy / Triad             1.61/1.70  1.67   Azure ND A100 v4 [HBM]
======  ===================================  =========  =====  =====================================

Sources:

* [MAMF] S. Bekman, *Machine Learning Engineering*, github.com/stas00/ml-engineering,
  compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table" (BF16;
  the best of a brute-force search over shapes; "H200 is the same" as H100 SXM).
* [cuBLAS] github.com/pranjalssh/fast.cu, README, "Kernel 0" (a plain cuBLAS call, BF16 in,
  FP32 accumulate, square matrices, H100 SXM); commit af9ce16 lists 4096 and 8192, a1bb7b2
  lists 6144 (741.1) and 8192 (797.8).
* [cuBLASLt] github.com/Azure/AI-benchmarking-guide, Azure_Results/ND_A100_v4_results.md,
  "GEMM CuBLASLt" (A100-SXM4-80GB, FP16, whose tensor-core peak equals BF16's 312 TFLOP/s).
* FA3: J. Shah et al., *FlashAttention-3*, arXiv 2407.08608v2, Fig. 5 (forward) and Fig. 6
  (backward), H100 80GB SXM5, clock fixed at 1830 MHz (App. C.1); the forward panels are
  also github.com/Dao-AILab/flash-attention assets/flash3_fp16_fwd.png. The paper gives no
  causal backward.
* FA2: T. Dao, *FlashAttention-2*, arXiv 2307.08691, Fig. 4 (forward + backward, A100 80GB
  SXM4), also assets/flash2_a100_fwd_bwd_benchmark.png; the FLOP count is
  benchmarks/benchmark_flash_attention.py's ``flops()`` in that repository.
* [HBM] github.com/Azure/AI-benchmarking-guide, Azure_Results/ND_{H100,H200,A100}_v{5,5,4}
  _results.md, "HBM Bandwidth" (BabelStream).
* [clone] github.com/Dao-AILab/quack, AI/hadamard_roofline_analysis.md, "Achievable
  bandwidth: torch.clone" (3003 GB/s bf16, 3029 fp32, H100 SXM).
* [softmax] github.com/Dao-AILab/quack, media/2025-07-10-membound-sol.md, "NCU profile"
  (3.01 TB/s, 89.7% of peak).

The fitted rates (:data:`RATES`) reproduce every figure above within 10%
(tests/test_device.py); ``python -m benchmarks.device`` prints the model beside them. How
each constant was chosen, and what no figure above pins down:

* GEMM: one k0 = 512 for both GPUs; E and t0 per GPU, minimising the worst error over that
  GPU's figures (H100 2.7%, A100 8.3%: the Azure A100 table is not smooth, its rate barely
  rises from 2048^3 to 4096^3, 221.8 to 228.0, then jumps to 253.7 at 8192^3). No BF16 figure below 4096^3 exists
  for H100 among the sources, so its t0 = 4 us is not fitted: it is kept below the 7.8 us
  that a whole 1024^3 FP8 GEMM takes on H100 (274 TFLOP/s, Azure ND H100 v5, "GEMM
  CuBLASLt"), which bounds any fixed cost per kernel there.
* Attention: (R, s_half) per curve, fitted to its six points (worst 6%).
* HBM: one share of the datasheet per GPU, between each GPU's copy and triad figures.
* H200: the H100's GEMM and attention constants (same SMs and clocks; the MAMF table
  notes "H200 is the same"); only its HBM is its own. Not checked against an H200 kernel
  figure beyond the HBM ones.
"""

from typing import NamedTuple


class GemmFigure(NamedTuple):
    device: str
    shape: tuple  # (m, n, k)
    tflops: float
    source: str


class AttentionFigure(NamedTuple):
    device: str
    passes: str  # "fwd", "bwd" or "fwd+bwd"
    head_dim: int
    causal: bool
    seqlen: int
    tflops: float
    source: str

    @property
    def batch(self):
        return 16384 // self.seqlen  # 16k tokens per run, as both papers set it

    @property
    def heads(self):
        return 2048 // self.head_dim  # hidden size 2048


class HbmFigure(NamedTuple):
    device: str
    kernel: str
    tbps: float
    source: str


MAMF = "S. Bekman, ml-engineering, compute/accelerator/README.md, MAMF table (BF16)"
FAST_CU = "pranjalssh/fast.cu README, cuBLAS (Kernel 0), H100 SXM, commit "
AZURE = "Azure/AI-benchmarking-guide, Azure_Results/ND_{}_results.md, "

PUBLISHED_GEMM = (
    GemmFigure("H100", (2048, 2048, 13312), 794.5, MAMF),
    GemmFigure("H100", (8192, 8192, 8192), 795.0, FAST_CU + "af9ce16"),
    GemmFigure("H100", (4096, 4096, 4096), 716.0, FAST_CU + "af9ce16"),
    GemmFigure("H100", (6144, 6144, 6144), 741.1, FAST_CU + "a1bb7b2"),
    GemmFigure("A100", (1024, 10240, 5120), 271.2, MAMF),
    *(GemmFigure("A100", shape, tflops, AZURE.format("A100_v4") + "GEMM CuBLASLt (FP16)") for shape, tflops in (
        ((1024, 1024, 1024), 119.4), ((2048, 2048, 2048), 221.8), ((4096, 4096, 4096), 228.0),
        ((8192, 8192, 8192), 253.7), ((16384, 16384, 16384), 256.5), ((1024, 2145, 1024), 132.8),
        ((6144, 12288, 12288), 250.8), ((802816, 192, 768), 157.8))),
)

SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
_FA3 = "FlashAttention-3, arXiv 2407.08608v2, Fig. "
_FA2 = "FlashAttention-2, arXiv 2307.08691, Fig. "
_CURVES = (  # device, passes, head dim, causal, figures at SEQLENS (None: hidden by the legend), source
    ("H100", "fwd", 64, False, (333, 392, 460, 476, 496, 497), _FA3 + "5a"),
    ("H100", "fwd", 64, True, (197, 265, 371, 420, 460, 473), _FA3 + "5b"),
    ("H100", "fwd", 128, False, (467, 565, 625, 638, 646, 648), _FA3 + "5c"),
    ("H100", "fwd", 128, True, (292, 423, 521, 579, 602, 616), _FA3 + "5d"),
    ("H100", "fwd", 256, False, (482, 627, 707, 736, 746, 756), _FA3 + "5e"),
    ("H100", "fwd", 256, True, (286, 427, 537, 612, 628, 642), _FA3 + "5f"),
    ("H100", "bwd", 64, False, (272, 363, 422, 453, 472, 474), _FA3 + "6a"),
    ("H100", "bwd", 128, False, (316, 424, 501, 542, 559, 561), _FA3 + "6b"),
    ("A100", "fwd+bwd", 64, False, (132, None, 162, 171, 175, 176), _FA2 + "4a"),
    ("A100", "fwd+bwd", 128, False, (None, None, 187, 196, 201, 203), _FA2 + "4b"),
    ("A100", "fwd+bwd", 64, True, (88, 119, 140, 156, 165, 171), _FA2 + "4c"),
    ("A100", "fwd+bwd", 128, True, (99, 133, 155, 173, 182, 189), _FA2 + "4d"),
)
PUBLISHED_ATTENTION = tuple(AttentionFigure(dev, passes, d, causal, s, v, src)
                            for dev, passes, d, causal, values, src in _CURVES
                            for s, v in zip(SEQLENS, values) if v is not None)

PUBLISHED_HBM = (
    HbmFigure("H100", "BabelStream Copy", 2.90, AZURE.format("H100_v5") + "HBM Bandwidth"),
    HbmFigure("H100", "BabelStream Triad", 2.97, AZURE.format("H100_v5") + "HBM Bandwidth"),
    HbmFigure("H100", "torch.clone, bf16, 1 GiB", 3.00, "Dao-AILab/quack, AI/hadamard_roofline_analysis.md"),
    HbmFigure("H100", "softmax, fp32, 16k x 131k", 3.01, "Dao-AILab/quack, media/2025-07-10-membound-sol.md"),
    HbmFigure("H200", "BabelStream Copy", 4.01, AZURE.format("H200_v5") + "HBM Bandwidth"),
    HbmFigure("H200", "BabelStream Triad", 4.15, AZURE.format("H200_v5") + "HBM Bandwidth"),
    HbmFigure("A100", "BabelStream Copy", 1.61, AZURE.format("A100_v4") + "HBM Bandwidth"),
    HbmFigure("A100", "BabelStream Triad", 1.70, AZURE.format("A100_v4") + "HBM Bandwidth"),
)


class Rates(NamedTuple):
    """The fitted constants of one GPU's kernels (their meaning: :class:`~emulator.machine.
    device.Device`). ``attention`` rows: (pass, masked, head dim, R in FLOP/s, s_half)."""

    gemm_efficiency: float
    gemm_k_overhead: int
    launch_seconds: float
    hbm_efficiency: float
    attention: tuple


_H100_ATTENTION = (  # FlashAttention-3, fitted to Fig. 5 and 6
    ("fwd", False, 64, 516e12, 296), ("fwd", False, 128, 672e12, 208), ("fwd", False, 256, 790e12, 304),
    ("fwd", True, 64, 506e12, 856), ("fwd", True, 128, 657e12, 608), ("fwd", True, 256, 693e12, 688),
    ("bwd", False, 64, 495e12, 400), ("bwd", False, 128, 590e12, 424),
)
_A100_ATTENTION = tuple(  # FlashAttention-2, fitted to Fig. 4, which times both passes together
    (pass_, masked, d, rate, s_half) for pass_ in ("fwd", "bwd") for masked, d, rate, s_half in (
        (False, 64, 177e12, 176), (False, 128, 206e12, 208), (True, 64, 176e12, 504), (True, 128, 193e12, 480)))

RATES = {
    "H100": Rates(0.835, 512, 4e-6, 0.89, _H100_ATTENTION),
    "H200": Rates(0.835, 512, 4e-6, 0.85, _H100_ATTENTION),  # the H100's compute (MAMF: "the same")
    "A100": Rates(0.90, 512, 8e-6, 0.82, _A100_ATTENTION),
}
