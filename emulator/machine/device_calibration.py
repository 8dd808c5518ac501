"""Published kernel measurements the calibrated devices (:mod:`emulator.machine.device`) are
fitted to, kept as data, and the fitted rates. Every figure below is a kernel timed alone on
one GPU; none is a training run's throughput (model FLOPs utilisation), which the planner
is checked against and so must not be fitted.

GEMM (TFLOP/s of dense 16-bit matrix products, C (m x n) = A (m x k) B (k x n)):

======  =====================  =========  =======  ==============================================
device  m x n x k              published  model    source
======  =====================  =========  =======  ==============================================
H100    2048 x 2048 x 13312    794.5      754      S. Bekman, ml-engineering [MAMF], BF16 table
H100    8192 x 8192 x 8192     795        749      pranjalssh/fast.cu README [cuBLAS], af9ce16
H100    4096 x 4096 x 4096     716        783      pranjalssh/fast.cu README [cuBLAS], af9ce16
H100    6144 x 6144 x 6144     741.1      753      pranjalssh/fast.cu README [cuBLAS], a1bb7b2
A100    1024 x 10240 x 5120    271.2      250      S. Bekman, ml-engineering [MAMF], BF16 table
A100    1024 x 1024 x 1024     119.4      116      Azure ND A100 v4 [cuBLASLt], FP16
A100    2048 x 2048 x 2048     221.8      203      Azure ND A100 v4 [cuBLASLt], FP16
A100    4096 x 4096 x 4096     228.0      247      Azure ND A100 v4 [cuBLASLt], FP16
A100    8192 x 8192 x 8192     253.7      264      Azure ND A100 v4 [cuBLASLt], FP16
A100    16384 x 16384 x 16384  256.5      272      Azure ND A100 v4 [cuBLASLt], FP16
A100    1024 x 2145 x 1024     132.8      136      Azure ND A100 v4 [cuBLASLt], FP16
A100    6144 x 12288 x 12288   250.8      269      Azure ND A100 v4 [cuBLASLt], FP16
A100    802816 x 192 x 768     157.8      168      Azure ND A100 v4 [cuBLASLt], FP16
======  =====================  =========  =======  ==============================================

Attention (TFLOP/s of fused attention kernels, FLOPs counted as the papers count them: 4 s^2 d h
per sequence forward, half that under a causal mask, 2.5 times the forward for the
backward; batch 16384/s sequences of length s, 2048/d heads of dim d, 16-bit inputs):

============  =======  ===  ====  =======================  =======================  ====
device        pass     d    mask  published, s = 512..16k  model, same s            fig.
============  =======  ===  ====  =======================  =======================  ====
H100 (FA3)    fwd      64   -     333 392 460 476 496 497  321 396 448 480 497 506  5a
H100 (FA3)    fwd      64   yes   197 265 371 420 460 473  185 271 353 416 457 480  5b
H100 (FA3)    fwd      128  -     467 565 625 638 646 648  465 550 605 637 654 663  5c
H100 (FA3)    fwd      128  yes   292 423 521 579 602 616  290 403 499 567 609 632  5d
H100 (FA3)    fwd      256  -     482 627 707 736 746 756  482 599 681 732 760 775  5e
H100 (FA3)    fwd      256  yes   286 427 537 612 628 642  286 405 511 588 636 663  5f
H100 (FA3)    bwd      64   -     272 363 422 453 472 474  276 354 413 450 472 483  6a
H100 (FA3)    bwd      128  -     316 424 501 542 559 561  320 415 487 534 561 575  6b
A100 (FA2)    fwd+bwd  64   -     132   . 162 171 175 176  131 150 163 169 173 175  4a
A100 (FA2)    fwd+bwd  128  -       .   . 187 196 201 203  145 170 186 196 201 203  4b
A100 (FA2)    fwd+bwd  64   yes    88 119 140 156 165 171   88 117 141 156 166 171  4c
A100 (FA2)    fwd+bwd  128  yes    99 133 155 173 182 189   98 130 156 172 182 187  4d
H100 (FA2)    fwd      64   -     282 306 318 321 322 324  283 304 315 322 325 326  5a
H100 (FA2)    fwd      64   yes   180 229 262 284 295 299  180 227 262 283 295 301  5b
H100 (FA2)    fwd      128  -     309 350 362 368 370 370  313 343 360 369 374 377  5c
H100 (FA2)    fwd      128  yes   191 260 298 319 333 335  197 252 294 320 335 344  5d
H100 (FA2)    fwd      256  -     275 313 321 323 324 326  281 306 320 327 331 333  5e
H100 (FA2)    fwd      256  yes   208 251 278 293 297 298  210 249 275 289 297 302  5f
H100 (FA2)    fwd+bwd  64   -     215 254 274 288 294 296  216 252 275 287 294 298  7a
H100 (FA2)    fwd+bwd  128  -     248 294 320 326 335 338  251 291 316 330 337 341  7b
H100 (FA2)    fwd+bwd  64   yes   141 192 232 257 273 284  142 191 231 258 274 283  7c
H100 (FA2)    fwd+bwd  128  yes   163 221 265 294 308 328  161 218 263 294 313 323  7d
H100 (cuDNN)  fwd      64   -     335 373 395 408 412 413  328 368 391 404 411 414  5a
H100 (cuDNN)  fwd      64   yes   225 288 334 363 379 388  220 283 331 361 379 388  5b
H100 (cuDNN)  fwd      128  -     497 574 617 609 600 595  503 556 588 605 614 618  5c
H100 (cuDNN)  fwd      128  yes   315 410 484 518 529 539  310 400 468 511 536 549  5d
H100 (cuDNN)  fwd      256  -     470 546 580 581 580 581  468 526 561 580 590 596  5e
H100 (cuDNN)  fwd      256  yes   308 391 450 483 497 509  299 381 441 478 500 511  5f
H100 (cuDNN)  bwd      64   -     266 348 395 417 432 433  271 338 387 416 433 442  6a
H100 (cuDNN)  bwd      128  -     305 408 465 499 518 516  311 395 458 497 519 531  6b
============  =======  ===  ====  =======================  =======================  ====

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
  causal backward. Its red bars are cuDNN's fused attention on the same GPU (the "H100
  (cuDNN)" rows; the forward read off that image, the backward off Fig. 6 of the paper).
* FA2: T. Dao, *FlashAttention-2*, arXiv 2307.08691, Fig. 4 (forward + backward, A100 80GB
  SXM4), also assets/flash2_a100_fwd_bwd_benchmark.png; Fig. 7 (forward + backward, H100
  80GB SXM5: the same kernel without Hopper's TMA and warpgroup instructions, which
  PyTorch's SDPA runs as its flash backend), also assets/flash2_h100_fwd_bwd_benchmark.png
  (flash-attention at 0251105a), whose bars carry the numbers. FA2's H100 forward alone is
  in FA3's Fig. 5 beside FA3 (its FlashAttention-2 bars; the "H100 (FA2) fwd" rows above);
  the FLOP count is
  benchmarks/benchmark_flash_attention.py's ``flops()`` in that repository.
* [HBM] github.com/Azure/AI-benchmarking-guide, Azure_Results/ND_{H100,H200,A100}_v{5,5,4}
  _results.md, "HBM Bandwidth" (BabelStream).
* [clone] github.com/Dao-AILab/quack, AI/hadamard_roofline_analysis.md, "Achievable
  bandwidth: torch.clone" (3003 GB/s bf16, 3029 fp32, H100 SXM).
* [softmax] github.com/Dao-AILab/quack, media/2025-07-10-membound-sol.md, "NCU profile"
  (3.01 TB/s, 89.7% of peak).

The fitted rates (:data:`RATES`) reproduce every figure above (and XLA's H100 sweep below) within 10%
(tests/test_device.py); ``python -m benchmarks.device`` prints the model beside them. How
each constant was chosen, and what no figure above pins down:

* GEMM (:meth:`~emulator.machine.device.Device._gemm`): output tiles of 64 to 256 on a side
  placed on the SMs in waves, split-K where few tiles would leave SMs idle, the cheapest
  choice taken as cuBLAS's heuristic takes one; E, k0, t0 and the tile penalty per GPU,
  chosen by a grid over them minimising the worst error plus twice the median. On H100 they
  are fitted to XLA's measured sweep of 125 shapes from 256 to 4096 on each side (CUPTI
  kernel times, the median of five runs: ``xla/tools/matmul_perf_table_gen.cc``), whose
  small and skinny shapes no square benchmark covers; the model alone comes within 15% of
  92% of them (median 7%), so inside the sweep the GEMM's time is corrected to the
  measurement, the correction fading with the distance outside it (a product, per
  dimension, of 4096/dim beyond 4096 and dim/256 below 256). The sweep's smallest GEMMs
  take 5.2 us at least: that is the H100's fixed cost per GEMM (attention keeps 4 us). XLA's 4096^3 (783 TFLOP/s) is 9% above fast.cu's
  cuBLAS figure for the same shape (716): both are kept. A100: the nine figures above, worst
  8.5%.
* Attention: (R, s_half) per curve, fitted to its six points (worst 6%). Where a figure
  times both passes together (FA2 on A100), both passes get the curve's rate; FA2 on
  H100 has its forward measured alone (FA3's Fig. 5), so its backward is fitted to the
  both-pass figures (FA2's Fig. 7) with that forward (worst 3% over both). cuDNN's curves
  are fitted as FA3's are (worst 5%: its unmasked d = 128 forward peaks at 2k and falls
  after, which one curve cannot follow); its masked backward, like FA3's, takes what masking
  does to its forward. On H100 a kernel says which it is (``impl``: ``"flash"``, FA3's
  rates; ``"flash2"``, FA2's; ``"cudnn"``, cuDNN's); the stack chooses
  (:attr:`~emulator.machine.stack.Stack.flash_kernel`).
* HBM: one share of the datasheet per GPU, between each GPU's copy and triad figures.
* H200: the H100's GEMM and attention constants (same SMs and clocks; the MAMF table
  notes "H200 is the same"); only its HBM is its own. Not checked against an H200 kernel
  figure beyond the HBM ones.
"""

from typing import NamedTuple

from .declared_kernels import Attention


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
    kernel: str = "flash"  # "flash2": FlashAttention-2 on a device whose fastest kernel is another

    @property
    def batch(self):
        return 16384 // self.seqlen  # 16k tokens per run, as both papers set it

    @property
    def heads(self):
        return 2048 // self.head_dim  # hidden size 2048

    def kernels(self):
        """The kernels the figure times: the forward (two products per score block), the
        backward (five), or both; half the blocks under a causal mask."""
        fraction = 0.5 if self.causal else 1.0
        passes = {"fwd": (2,), "bwd": (5,), "fwd+bwd": (2, 5)}[self.passes]
        return [Attention(f"{self.source}", self.batch, self.heads, self.seqlen, self.seqlen, self.head_dim, p,
                          fraction, "bf16", self.kernel) for p in passes]


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

XLA = ("openxla/xla (in tensorflow/tensorflow at 372d578b), xla/service/gpu/model/matmul_interpolator_data.h, "
       "kDefaultMatmulPTable, key sm_90, bf16xbf16->bf16, b = 1")
XLA_M = (256, 512, 1024, 2048, 4096)
XLA_H100_GRID = (  # (n, k): TFLOP/s at m = 256, 512, 1024, 2048, 4096
    ((256, 256), (6.45, 11.5, 22.0, 43.6, 82.2)),
    ((256, 512), (11.5, 21.8, 40.9, 77.3, 137.2)),
    ((256, 1024), (19.5, 39.3, 68.3, 135.8, 217.2)),
    ((256, 2048), (31.1, 60.1, 113.2, 216.1, 304.7)),
    ((256, 4096), (84.3, 91.1, 169.7, 307.5, 376.2)),
    ((512, 256), (11.5, 21.6, 42.9, 83.9, 142.5)),
    ((512, 512), (22.0, 40.7, 82.2, 142.8, 238.8)),
    ((512, 1024), (39.1, 71.2, 141.3, 235.9, 370.8)),
    ((512, 2048), (62.4, 114.7, 220.0, 347.7, 521.7)),
    ((512, 4096), (91.7, 174.5, 298.9, 451.2, 650.0)),
    ((1024, 256), (22.7, 43.5, 82.0, 141.6, 216.5)),
    ((1024, 512), (41.8, 80.5, 145.6, 238.4, 343.7)),
    ((1024, 1024), (72.5, 138.7, 236.3, 373.3, 488.1)),
    ((1024, 2048), (119.0, 216.5, 350.0, 523.3, 632.0)),
    ((1024, 4096), (172.3, 309.6, 470.1, 653.1, 738.5)),
    ((2048, 256), (41.8, 79.3, 139.5, 213.0, 304.0)),
    ((2048, 512), (78.2, 143.4, 237.6, 345.5, 447.0)),
    ((2048, 1024), (138.1, 232.6, 373.3, 493.9, 593.2)),
    ((2048, 2048), (215.8, 342.4, 524.3, 632.0, 716.1)),
    ((2048, 4096), (285.9, 430.5, 653.5, 738.0, 758.4)),
    ((4096, 256), (78.0, 134.2, 209.7, 299.3, 392.2)),
    ((4096, 512), (138.1, 236.3, 338.9, 450.4, 543.1)),
    ((4096, 1024), (225.2, 373.3, 490.3, 594.2, 677.4)),
    ((4096, 2048), (324.6, 522.2, 634.2, 715.4, 738.7)),
    ((4096, 4096), (412.0, 644.1, 738.5, 753.6, 783.3)),
)
PUBLISHED_GEMM += tuple(GemmFigure("H100", (m, n, k), tflops, XLA) for (n, k), row in XLA_H100_GRID
                       for m, tflops in zip(XLA_M, row))

SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
_FA3 = "FlashAttention-3, arXiv 2407.08608v2, Fig. "
_FA2 = "FlashAttention-2, arXiv 2307.08691, Fig. "
_CURVES = (  # device, passes, head dim, causal, figures at SEQLENS (None: hidden by the legend), source,
    # kernel ("flash": the device's fastest; "flash2": FlashAttention-2 where that is not it)
    ("H100", "fwd", 64, False, (333, 392, 460, 476, 496, 497), _FA3 + "5a", "flash"),
    ("H100", "fwd", 64, True, (197, 265, 371, 420, 460, 473), _FA3 + "5b", "flash"),
    ("H100", "fwd", 128, False, (467, 565, 625, 638, 646, 648), _FA3 + "5c", "flash"),
    ("H100", "fwd", 128, True, (292, 423, 521, 579, 602, 616), _FA3 + "5d", "flash"),
    ("H100", "fwd", 256, False, (482, 627, 707, 736, 746, 756), _FA3 + "5e", "flash"),
    ("H100", "fwd", 256, True, (286, 427, 537, 612, 628, 642), _FA3 + "5f", "flash"),
    ("H100", "bwd", 64, False, (272, 363, 422, 453, 472, 474), _FA3 + "6a", "flash"),
    ("H100", "bwd", 128, False, (316, 424, 501, 542, 559, 561), _FA3 + "6b", "flash"),
    ("A100", "fwd+bwd", 64, False, (132, None, 162, 171, 175, 176), _FA2 + "4a", "flash"),
    ("A100", "fwd+bwd", 128, False, (None, None, 187, 196, 201, 203), _FA2 + "4b", "flash"),
    ("A100", "fwd+bwd", 64, True, (88, 119, 140, 156, 165, 171), _FA2 + "4c", "flash"),
    ("A100", "fwd+bwd", 128, True, (99, 133, 155, 173, 182, 189), _FA2 + "4d", "flash"),
    ("H100", "fwd", 64, False, (282, 306, 318, 321, 322, 324), _FA3 + "5a", "flash2"),
    ("H100", "fwd", 64, True, (180, 229, 262, 284, 295, 299), _FA3 + "5b", "flash2"),
    ("H100", "fwd", 128, False, (309, 350, 362, 368, 370, 370), _FA3 + "5c", "flash2"),
    ("H100", "fwd", 128, True, (191, 260, 298, 319, 333, 335), _FA3 + "5d", "flash2"),
    ("H100", "fwd", 256, False, (275, 313, 321, 323, 324, 326), _FA3 + "5e", "flash2"),
    ("H100", "fwd", 256, True, (208, 251, 278, 293, 297, 298), _FA3 + "5f", "flash2"),
    ("H100", "fwd+bwd", 64, False, (215, 254, 274, 288, 294, 296), _FA2 + "7a", "flash2"),
    ("H100", "fwd+bwd", 128, False, (248, 294, 320, 326, 335, 338), _FA2 + "7b", "flash2"),
    ("H100", "fwd+bwd", 64, True, (141, 192, 232, 257, 273, 284), _FA2 + "7c", "flash2"),
    ("H100", "fwd+bwd", 128, True, (163, 221, 265, 294, 308, 328), _FA2 + "7d", "flash2"),
    ("H100", "fwd", 64, False, (335, 373, 395, 408, 412, 413), _FA3 + "5a", "cudnn"),
    ("H100", "fwd", 64, True, (225, 288, 334, 363, 379, 388), _FA3 + "5b", "cudnn"),
    ("H100", "fwd", 128, False, (497, 574, 617, 609, 600, 595), _FA3 + "5c", "cudnn"),
    ("H100", "fwd", 128, True, (315, 410, 484, 518, 529, 539), _FA3 + "5d", "cudnn"),
    ("H100", "fwd", 256, False, (470, 546, 580, 581, 580, 581), _FA3 + "5e", "cudnn"),
    ("H100", "fwd", 256, True, (308, 391, 450, 483, 497, 509), _FA3 + "5f", "cudnn"),
    ("H100", "bwd", 64, False, (266, 348, 395, 417, 432, 433), _FA3 + "6a", "cudnn"),
    ("H100", "bwd", 128, False, (305, 408, 465, 499, 518, 516), _FA3 + "6b", "cudnn"),
)
PUBLISHED_ATTENTION = tuple(AttentionFigure(dev, passes, d, causal, s, v, src, kernel)
                            for dev, passes, d, causal, values, src, kernel in _CURVES
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
    device.Device`). ``attention`` rows: (pass, masked, head dim, R in FLOP/s, s_half);
    ``tile_penalty``: how much a smaller output tile loses (in elements of its
    tm tn / (tm + tn)); ``split_k_seconds``: a split-K GEMM's extra fixed cost; ``sweep``:
    the measured sweep its GEMMs are corrected to ((m, n, k) -> TFLOP/s), or ()."""

    gemm_efficiency: float
    gemm_k_overhead: int
    launch_seconds: float
    hbm_efficiency: float
    attention: tuple
    tile_penalty: float = 0.0
    split_k_seconds: float = 0.0
    sweep: tuple = ()
    gemm_launch: float = None  # a GEMM's fixed cost, where the sweep pins it (None: launch_seconds)
    attention_flash2: tuple = ()  # FlashAttention-2's rows, where it is not the device's fastest (H100)
    attention_cudnn: tuple = ()  # cuDNN's fused attention's rows, where they differ from the fastest (H100)

    def kernel_rows(self):
        """{kernel: its attention rows} for the kernels other than the device's fastest
        (``impl`` of :class:`~emulator.machine.declared_kernels.Attention`)."""
        return {"flash2": self.attention_flash2, "cudnn": self.attention_cudnn}


_H100_ATTENTION = (  # FlashAttention-3, fitted to Fig. 5 and 6
    ("fwd", False, 64, 516e12, 296), ("fwd", False, 128, 672e12, 208), ("fwd", False, 256, 790e12, 304),
    ("fwd", True, 64, 506e12, 856), ("fwd", True, 128, 657e12, 608), ("fwd", True, 256, 693e12, 688),
    ("bwd", False, 64, 495e12, 400), ("bwd", False, 128, 590e12, 424),
)
_H100_FLASH2 = (  # FlashAttention-2 on H100: the forward fitted to FA3's Fig. 5 (its FA2 bars), the
    # backward to FA2's Fig. 7 (both passes together) with that forward
    ("fwd", False, 64, 328e12, 72), ("fwd", False, 128, 379e12, 96), ("fwd", False, 256, 335e12, 88),
    ("fwd", True, 64, 308e12, 344), ("fwd", True, 128, 352e12, 384), ("fwd", True, 256, 306e12, 216),
    ("bwd", False, 64, 292e12, 240), ("bwd", False, 128, 333e12, 216),
    ("bwd", True, 64, 287e12, 608), ("bwd", True, 128, 327e12, 592),
)
_H100_CUDNN = (  # cuDNN's fused attention on H100, fitted to its bars in FA3's Fig. 5 and 6
    ("fwd", False, 64, 418e12, 128), ("fwd", False, 128, 623e12, 104), ("fwd", False, 256, 601e12, 128),
    ("fwd", True, 64, 398e12, 392), ("fwd", True, 128, 563e12, 384), ("fwd", True, 256, 523e12, 352),
    ("bwd", False, 64, 451e12, 336), ("bwd", False, 128, 543e12, 376),
)
_A100_ATTENTION = tuple(  # FlashAttention-2, fitted to Fig. 4, which times both passes together
    (pass_, masked, d, rate, s_half) for pass_ in ("fwd", "bwd") for masked, d, rate, s_half in (
        (False, 64, 177e12, 176), (False, 128, 206e12, 208), (True, 64, 176e12, 504), (True, 128, 193e12, 480)))

_H100_SWEEP = tuple(((m, n, k), tflops) for (n, k), row in XLA_H100_GRID for m, tflops in zip(XLA_M, row))

RATES = {
    "H100": Rates(0.88, 256, 4e-6, 0.89, _H100_ATTENTION, 8.0, 1e-6, _H100_SWEEP, 5e-6, _H100_FLASH2, _H100_CUDNN),
    "H200": Rates(0.88, 256, 4e-6, 0.85, _H100_ATTENTION, 8.0, 1e-6, _H100_SWEEP, 5e-6, _H100_FLASH2,
                  _H100_CUDNN),  # H100's compute (MAMF)
    "A100": Rates(0.90, 512, 8e-6, 0.82, _A100_ATTENTION, 0.0, 1e-6, (), 4e-6),
}
