"""Torch pieces the GPU labs share, reusable on other models.

* ``ddp.DDP``: data parallelism for any module, bucketed all-reduces overlapped with
  backward, tied weights reduced once, frozen parameters skipped.
* ``sharded_optimizer.ShardedOptimizer``: ZeRO-1 over any ``torch.optim`` optimizer.
* ``tensor_parallel.TPBlock``: a Megatron transformer block (column- then row-parallel,
  f/g as autograd functions, optional sequence parallelism), call for call the emulator's.
* ``pipeline.Executor``: a pipeline schedule from ``emulator.parallel.pipeline`` run over
  ``batch_isend_irecv`` on ``GPTStage`` chunks of the course GPT (also usable under
  ``torch.distributed.pipelining``), call for call the emulator's executor.
* ``ring_attention.ring_attention``: ring attention as an autograd function (the backward
  passes dK/dV around the ring), call for call the emulator's.
* ``expert_parallel.ep_moe``: an expert-parallel MoE layer over ``all_to_all_single``
  (dropless), differentiable, call for call the emulator's.
* ``mesh``: the course GPT as torch modules on a device mesh: TP + SP with
  ``parallelize_module``, FSDP2 per block, pipeline stages for ``torch.distributed.pipelining``.
* ``data_parallel``: the course GPT's DDP and ZeRO-1/2/3 written call for call as
  ``emulator.parallel`` runs them (lab 01 compares the traces).
"""
