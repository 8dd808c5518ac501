"""The GPU labs: each lesson's algorithm run on real hardware with ``torch.distributed``
(NCCL on GPUs, gloo on the CPU), checked against a single-rank reference and, call for
call, against the emulator.

A lab is a module of this package, run with torchrun's ``-m`` from the course's folder
(or from anywhere once the course is pip-installed)::

    torchrun --standalone --nproc-per-node 4 -m gpu_labs.01_data_parallel

* ``00_collectives`` ... ``07_checkpoint``: one lab per lesson; each docstring begins
  with its command, ``--help`` lists its options.
* ``common``: start torch.distributed, pick the backend, time, report, fail clearly.
* ``checks``: comparisons with nothing left out; ``call_trace``: the calls a lab makes,
  recorded in the format of ``emulator.records.calls``.
* ``tp_dtensor`` (lab 02) and ``mesh_calls`` (lab 06): pieces of one lab in a file of
  their own.
* ``torch_parallel``: the torch pieces the labs share, reusable on other models.

``gpu_labs/README.md`` covers installing on a cluster, several nodes and SLURM.
"""
