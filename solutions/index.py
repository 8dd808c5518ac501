# %% [markdown]
# # Parallelism from Scratch
#
# How are large language models trained on thousands of GPUs? This course builds every
# piece from scratch — collectives, data parallelism and ZeRO, tensor and pipeline
# parallelism, ring attention, expert parallelism — first on an **emulator** of a
# multi-GPU machine that runs in these notebooks, then on real GPUs with `torch.distributed`.
#
# The emulator runs one Python function per GPU ("rank") on real NumPy data. It records
# every message sent and every byte held, keeps a simulated clock per GPU, and stops with
# a clear error the moment a program misuses a collective (mismatched calls, deadlocks).
# So every claim in the lessons is executed and measured, not just stated.
#
# ## Start here
#
# Begin with lesson 00, *Collectives*: every later lesson moves its data with the ring
# collectives you build there. Then take the lessons in order; each builds on the ones
# before it.
#
# ## Lessons
#
# | # | lesson | you build | widget | GPU lab |
# |---|---|---|---|---|
# | 00 | [Collectives](00_collectives.ipynb) | ring reduce-scatter, all-gather, all-reduce in the global view and from point-to-point calls; alpha-beta cost; bus bandwidth; channels over NICs | ring stepper | `gpu_labs/00_collectives.py` |
# | 01 | [Data parallelism and ZeRO](01_data_parallel.ipynb) | DDP with overlapped buckets, ZeRO-2, ZeRO-3 with prefetch, on a small GPT; memory over time and traffic measured | ZeRO memory explorer | `gpu_labs/01_data_parallel.py` |
# | 02 | [Tensor and sequence parallelism](02_tensor_parallel.ipynb) | Megatron MLP and attention by heads, the f/g operators, sequence-parallel regions and their missing all-reduce, vocabulary-parallel cross-entropy; activation memory measured term by term | activation memory explorer | `gpu_labs/02_tensor_parallel.py` |
# | 03 | [Pipeline parallelism](03_pipeline.ipynb) | the 1F1B schedule as data, the per-rank loop that runs any schedule with `batch_isend_irecv`, the DP+PP gradient average; GPipe, 1F1B, interleaved and zero-bubble (ZB-H1) bubbles and memory measured | schedule explorer | `gpu_labs/03_pipeline.py` |
# | 04 | [Context parallelism](04_context_parallel.ipynb) | the online softmax on one device, the ring attention forward with its transfers hidden behind compute, the zigzag layout and its causal masks, the ring backward; all-gather K/V and Ulysses measured beside the ring; bf16 vs fp32 running sums | ring attention stepper | `gpu_labs/04_context_parallel.py` |
# | 05 | [Expert parallelism](05_expert_parallel.ipynb) | top-k routing, the permutation into expert order and back, the expert-parallel forward (count exchange, dispatch, combine) and backward, capacity with dropping; imbalance as time, two-hop all-to-all across nodes, EP vs TP for experts, three published MoE models | routing explorer | `gpu_labs/05_expert_parallel.py` |
# | 06 | [The mesh](06_mesh.ipynb) | a mesh's coordinates and groups; DP4 x TP8 x PP2 on 64 GPUs run against one device; a plan's memory per GPU and bytes per axis, checked on the emulator; ZeRO along dp under TP x PP; the practical order from the plans that break it; three claims about a split, as a function; a plan chosen and run; the planner beside published runs (Narayanan 2021, Megatron-LM, Llama 3) and case studies | mesh planner, full planner | `gpu_labs/06_mesh.py` |
# | 07 | [When GPUs fail](07_failures.ipynb) | a dead rank and the watchdog that stops its peers, a straggler found in a timeline; sharded checkpoints (optimizer, data position, RNG, a manifest), synchronous and asynchronous saves on the clock; the block reader that reshards a checkpoint onto another mesh (DP 8 to DP 6, TP 2 to TP 4, ZeRO-3 to ZeRO-1); Young's and Daly's checkpoint interval against Monte Carlo at Llama 3's failure rate | failure and checkpoint explorer | `gpu_labs/07_checkpoint.py` |
#
# ## How to work through a lesson
#
# 1. Open the lesson from the table and run it all (*Run → Run All Cells*). The whole
#    lesson runs, demos and pictures included, before you have answered anything: the
#    check of an exercise you have not attempted yet prints
#    `NOT ATTEMPTED Exercise N.k: ...` and the lesson goes on.
# 2. Read, look at the pictures, move the widgets' sliders.
# 3. At each exercise, replace `raise NotImplementedError("Exercise N.k: ...")` with your
#    code, run that cell, then the **check cell** under it. A check prints
#    `PASSED Exercise N.k: ...`, or stops with a `CheckFailed` whose first line says what
#    differs. A wrong answer stops Run All at its check, so you see it there. Keep all of an
#    answer (helpers included) in the exercise's own cell: grading takes only those cells
#    from your notebook and runs the course's for the rest.
# 4. Napkin problems work the same way: a function returns your numbers; the check calls it
#    with the problem's numbers and with others, and compares each with the model.
# 5. The last cell, *Where you stand*, lists every exercise of the lesson as passed,
#    failed or not attempted. It fails until all have passed.
#
# Your answers live in `lessons/NN_name.ipynb`; nothing the course runs overwrites them
# (`make notebooks` keeps a lesson whose cells you have changed). Stuck? `solutions/` holds
# the same notebooks, answered and executed.
#
# ## Checking your work
#
# Save the notebook (`Ctrl+S`), then, in a terminal in the course folder:
#
# ```
# make grade LESSON=03
# ```
#
# runs the lesson from the top in a fresh kernel, with your exercise cells from the saved
# `lessons/03_pipeline.ipynb` (so it grades what you saved, not what your open kernel
# remembers) and the course's own cells around them, and prints one line per exercise, by
# its name:
#
# ```
# lessons/03_pipeline.ipynb: 2 of 6 exercises passed (ran in 23 s)
#   PASS           Problem 8.2: micro-batches for a small bubble
#   PASS           Exercise 3.1: 1F1B as data
#   FAIL           Napkin 3.1: memory against bubble: (1F1B's micro-batches, p=16, per_micro_batch=2e+09, budget=2.4e+10, max_m=256): expected 12, got 256: 1F1B's first stage holds min(p, m) micro-batches, and 16 of them (3.2e+10 bytes) do not fit in 2.4e+10; with fewer than p in flight it can run only as many as GPipe
#   NOT ATTEMPTED  Exercise 3.2: the per-rank loop
#   NOT ATTEMPTED  Exercise 3.3: zero bubble (ZB-H1) from 1F1B
#   NOT ATTEMPTED  Exercise 3.4: the data-parallel average of a stage's gradients
# ```
#
# A failing check does not stop the others: every exercise is graded. `make grade` with no
# `LESSON` grades every lesson. While a check runs your code, the library's own answer to
# that exercise refuses to run, and napkin answers are called with other numbers too, so
# only a real answer passes.
#
# ## The GPU labs

#
# Each lesson ends with a script in `gpu_labs/` that runs its algorithm with
# `torch.distributed` (NCCL on GPUs, gloo on a CPU), checks the result, and prints the
# measurements beside the emulator's predictions:
#
# ```
# torchrun --standalone --nproc-per-node 8 -m gpu_labs.00_collectives
# ```
#
# `gpu_labs/README.md` covers several nodes and SLURM. The labs need torch, which `make lab`
# does not install: `make test` adds it to the same `.venv` (the README's install section
# says how a course cluster installs beside its own torch).
#
# ## For instructors
#
# Hand out `lessons/` and keep `solutions/` as the answer key. To grade a folder of filled
# notebooks (one per student, or one folder per student):
#
# ```
# .venv/bin/python -m tools.grade SUBMISSIONS_DIR --report grades.csv -j 2
# ```
#
# grades each submission on the course's own notebook with only its exercise cells taken
# from the student's file, in a fresh copy of the course with time and memory limits, and
# writes one row per file (the student, the lesson, PASS, FAIL, NOT ATTEMPTED, NOT RUN or
# NOT FOUND and the points of every exercise, the total, which of a student's files counts)
# and a feedback file per student with each check's message. A submission that tampers
# with the checks is reported `TAMPERED`; a file that cannot be graded gets an `ERROR` row.
# What the grader guards against, and the container that guards against the rest, are in
# the README ("Grading a class"). `pytest --nbval-lax` works too: an unfinished lesson
# fails at its last cell. Problem sets with different numbers for every student (the
# napkins of the lessons and Problems 8.1 to 8.4; answers are JSON, graded against the same
# functions as the checks):
#
# ```
# .venv/bin/python -m tools.problem_set make --students alice,bob --out sheets/
# .venv/bin/python -m tools.problem_set grade ANSWERS_DIR --report grades.csv
# ```
#
# The notebooks and this page are generated from `solutions/NN_name.py` and
# `solutions/index.py` by `make notebooks`.
#
# ## Glossary
#
# One vocabulary throughout the course, following `torch.distributed`:
#
# | term | meaning |
# |---|---|
# | **rank** | one process, one GPU; numbered 0..size-1 |
# | **world**, **size** | all ranks, and how many there are |
# | **group** | a subset of ranks that run collectives together (`comm.group("tp")`) |
# | **mesh**, **axis** | ranks arranged as a grid with named axes (`dp`, `tp`, `pp`, `cp`, `ep`); the last axis is innermost, so its ranks share a node |
# | **dim** | a tensor dimension (never a mesh axis) |
# | **collective** | an operation every rank of a group calls together: all-reduce, reduce-scatter, all-gather, broadcast, all-to-all |
# | **all-reduce** | every rank ends with the elementwise sum (or max, mean) of all ranks' buffers |
# | **reduce-scatter** | the sum, split in chunks: rank r keeps chunk r |
# | **all-gather** | every rank ends with every rank's chunk, concatenated in rank order |
# | **point to point** | `send`/`recv` between two ranks; as on NCCL a send completes only when its receive is posted (a *rendezvous*), so both are often posted together with `batch_isend_irecv` |
# | **stream** | a queue of work on a GPU: compute on one, each group's communication on its own; `async_op=True` and `wait()` let them overlap |
# | **alpha, beta** | a message of m bytes costs alpha + m/beta seconds: latency and bandwidth |
# | **algbw, busbw** | nccl-tests' bandwidths: bytes/time, and that times the op's traffic factor (2(n-1)/n for all-reduce) |
# | **NVLink, InfiniBand** | the fast link inside a node, the slower one between nodes (one NIC per GPU on H100/H200 clusters) |
# | **channel** | one of the parallel rings NCCL splits a collective into; each crosses between nodes through a different GPU's NIC |
# | **data parallelism (DP)** | every rank holds the model, takes a slice of the batch, and sums gradients |
# | **ZeRO-1/2/3, FSDP** | data parallelism that shards optimizer state (1), also gradients (2), also parameters (3, a.k.a. FSDP); `zero_stage` in code |
# | **bucket** | DDP's unit of gradient reduction: gradients laid together and all-reduced as soon as all exist |
# | **prefetch** | starting the all-gather of the next layer's parameters while this layer computes (ZeRO-3) |
# | **gradient accumulation** | several micro-batches' gradients summed before one update |
# | **activation recomputation** | keeping only a layer's input in forward and recomputing the rest in backward |
# | **tensor parallelism (TP)** | one layer's matrices split across ranks |
# | **column-, row-parallel** | a weight split by output columns (each rank a slice of the output) or by input rows (each rank a partial sum of it) |
# | **f, g operators** | Megatron's pair around a TP block: f is the identity in forward and an all-reduce in backward; g the other way round |
# | **sequence parallelism (SP)** | the norms, dropouts and residuals that TP leaves whole, split along the sequence; all-reduces become all-gather + reduce-scatter |
# | **vocabulary parallelism** | the embedding and output layer split by vocabulary; the loss needs only per-token sums across ranks |
# | **activation memory** | what a layer keeps from forward for backward: sbh(34 + 5as/h) bytes per layer (Korthikanti et al.) |
# | **pipeline parallelism (PP)** | the layer stack cut into stages on different ranks; micro-batches flow through |
# | **stage**, **virtual stage** | a pipeline rank's run of layers; with interleaving each rank holds v non-contiguous chunks, virtual stages c·p + r |
# | **bubble** | time a pipeline stage sits idle: (p-1)/(m+p-1) of the step for GPipe and 1F1B, or (p-1)/m over the ideal time |
# | **schedule** | per rank, the ordered list of actions F (forward), B (backward, or its input-gradient part) and W (weight gradient) |
# | **GPipe, 1F1B** | all forwards then all backwards; or one forward one backward after a warm-up, which holds at most p micro-batches |
# | **interleaved 1F1B** | 1F1B over v chunks per rank: the bubble divided by v, v times the point-to-point messages |
# | **zero bubble (ZB-H1)** | the backward split into B and W, the W's moved into the idle gaps |
# | **context parallelism (CP)** | the sequence split across ranks; ring attention passes K/V around |
# | **online softmax** | softmax attention one block of keys at a time, keeping a running max, sum and output (FlashAttention's recurrence) |
# | **ring attention** | each rank keeps its queries; K/V blocks go around the ring of ranks, each transfer hidden behind the compute on the block before |
# | **zigzag layout** | rank i of c holds sequence chunks i and 2c-1-i, so causal attention gives every rank the same work |
# | **Ulysses** | context parallelism by all-to-all from sequence shards to head shards and back; at most as many ranks as heads |
# | **mixture of experts (MoE)** | an MLP replaced by many experts and a router that sends each token to its top-k; parameters grow with the experts, compute with k |
# | **expert parallelism (EP)** | a mixture-of-experts layer's experts on different ranks; tokens travel by all-to-all (dispatch) and back (combine) |
# | **capacity factor** | an expert takes at most ceil(c·T·k/E) assignments; the rest are dropped (dropless: no cap) |
# | **load-balancing loss** | Switch Transformer's E·Σ f_e·P_e, added to the loss so the router spreads tokens evenly |
# | **micro-batch** | a slice of the batch processed as a unit (pipelines, gradient accumulation) |
# | **ParallelDims**, **plan** | one description of a run: dp, tp, pp, cp, ep, zero_stage, sequence parallelism, schedule, micro-batches, recomputation |
# | **placement** | where a parameter lives on the mesh: sharded along a dim over some axes, replicated over the others (DTensor's Shard / Replicate / Partial) |
# | **expert data parallelism (EDP)** | the ranks that hold the same experts; experts' gradients reduce over them, dense ones over dp x cp |
# | **MFU, HFU** | model FLOPs (6N plus attention per token, no recomputation) or the FLOPs actually executed, over the step time and the GPUs' peak |
# | **planner** | `emulator.planner`: a plan's memory, traffic, bubble and step time predicted as the emulator would measure them, and every plan of a cluster ranked |
# | **shape-only run** | the emulator's programs on arrays without values: the real shapes, bytes, ledgers and timeline, no arithmetic |
# | **Ψ (psi)** | number of parameters |
# | **K** | optimizer bytes per parameter (12 for mixed-precision Adam) |
# | **MTBF** | mean time between failures; a job of N GPUs that fail independently fails N times as often as one |
# | **watchdog** | ProcessGroupNCCL's thread that stops a process whose collective has waited longer than its timeout (10 minutes by default) |
# | **straggler** | a rank that is slow, not dead: every collective waits for it |
# | **checkpoint** | what every rank saves to restart from: its shards of parameters and optimizer state, the data position, the RNG state |
# | **manifest** | a checkpoint's index, written last: each tensor's global shape and the offsets and sizes of its saved chunks |
# | **asynchronous checkpoint** | a save that stops training only to copy the state to host memory, then writes it in the background |
# | **resharding** | loading a checkpoint onto another mesh: each rank reads the parts of the saved chunks that overlap its own block |
# | **goodput** | the share of wall time that is new progress, after saves, lost work and restarts |
# | **Young/Daly interval** | the checkpoint interval that maximises goodput, about the square root of 2 × save cost × MTBF |
# | **elastic restart** | `torchrun --max-restarts`: when a worker fails, the agent stops all workers and starts them again |
