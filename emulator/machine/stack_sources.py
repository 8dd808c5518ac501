"""Where each setting of the software stack presets (built in :mod:`emulator.machine.stack`,
:func:`~emulator.machine.stack.stack_preset`) is read from: a framework's file and line at a
commit, or a published measurement. ``tests/test_stack.py`` checks that every numeric setting equals the number in
its quote.

* ``"megatron-core"``: Megatron-Core with Transformer Engine, as the Megatron-LM README's
  H100 table ran it (its line 66: ``--overlap-grad-reduce --overlap-param-gather
  --tp-comm-overlap``), through ``pretrain_gpt.py``'s defaults (fused softmax, bias-GeLU,
  bias-dropout-add, RoPE, persistent LayerNorm, gradient-accumulation fusion; no fused
  cross-entropy), attention by Transformer Engine's backend choice (cuDNN's fused kernel
  on Hopper: its source is the Transformer Engine of June 2024, before the README's table;
  the rule stands unchanged at d0067d0,
  transformer_engine/pytorch/attention/dot_product_attention/utils.py:1647-1653), bf16
  under Megatron's policy;
* ``"megatron-2021"``: Megatron-LM as Narayanan et al. 2021 and Korthikanti et al. 2022 ran
  it: attention as batched GEMMs with the fused scale-mask-softmax (scores in HBM), the same
  elementwise fusions, gradients all-reduced after the pipeline flush, fp16 weights with
  fp32 main gradients;
* ``"pytorch-eager"``: PyTorch eager with ``torch.distributed`` (DDP, FSDP2, DTensor TP), as
  torchtitan writes a model: SDPA's flash backend, FlashAttention-2 (on H100 SDPA prefers
  cuDNN's kernel only with a cuDNN newer than 9.15.0, which torch's CUDA 12 wheels do not
  ship; a stack with ``flash_kernel="flash"`` models that case), every other op its own kernel, FSDP2's
  prefetch, DDP's 25 MB buckets, bf16 under FSDP2's ``MixedPrecisionPolicy``;
* ``"pytorch-compile"``: the same with ``torch.compile``: Inductor fuses each chain of
  pointwise and reduction ops between two GEMMs into one generated kernel.
"""

from dataclasses import dataclass

MLM = ("NVIDIA/Megatron-LM", "d98e8a64ddf34856e74b24714e3bedb2f5a39553")
TE = ("NVIDIA/TransformerEngine", "d0067d0da6cb01811b8072a7d304f0e00344ce2b")
TT = ("pytorch/torchtitan", "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a")
TT_BENCH = ("pytorch/torchtitan", "9dec370ad26b5f8e9a7333a0e36165018262644b")  # its Llama 3.1 benchmarks' commit


@dataclass(frozen=True)
class Source:
    """Where a setting comes from: ``repo`` at ``commit``, ``path`` and ``line``, the
    ``quote``d text; or, for a paper or a measurement, ``repo`` is its title and ``path``
    the section, table or figure. ``value``: the number the quote gives (None: a choice the
    quote states in words)."""

    repo: str
    commit: str
    path: str
    line: str
    quote: str
    value: float = None
    scale: float = 1.0  # the setting is value x scale (the quote's units into the setting's)

    def cite(self):
        where = f"{self.repo}@{self.commit[:7]} {self.path}:{self.line}" if self.commit else \
            f"{self.repo}, {self.path}"
        return f"{where}: {self.quote!r}"


def _src(repo, path, line, quote, value=None, scale=1.0):
    return Source(repo[0], repo[1], path, str(line), quote, value, scale)


MEGATRON_README = Source("NVIDIA/Megatron-LM README", "f2e5db4", "README.md", "66",
                         "--overlap-grad-reduce --overlap-param-gather --tp-comm-overlap")

MEGATRON_CORE = {
    "precision": _src(MLM, "megatron/training/arguments.py", "1207-1208",
                      "# bfloat16 requires gradient accumulation and all-reduce to be done in fp32."),
    "attention": _src(MLM, "megatron/core/transformer/transformer_config.py", "151",
                      "attention_backend: AttnBackend = AttnBackend.auto"),
    "flash_kernel": _src(("NVIDIA/TransformerEngine", "43569381ce3779f9bf6084da917556db210d745d"),
                         "transformer_engine/pytorch/attention.py", "4064-4072",
                         "# Select FusedAttention on sm90 and FlashAttention on others for performance ... "
                         "Disabling FlashAttention to give FusedAttention preference on Hopper+"),
    "fused.bias_act": _src(MLM, "megatron/training/arguments.py", "2892-2894",
                           "group.add_argument('--no-bias-gelu-fusion', action='store_false', ..."
                           "dest='bias_gelu_fusion')"),
    "fused.bias_dropout_add": _src(MLM, "megatron/training/arguments.py", "2899-2901",
                                   "group.add_argument('--no-bias-dropout-fusion', action='store_false', ..."
                                   "dest='bias_dropout_fusion')"),
    "fused.rope": _src(MLM, "megatron/training/arguments.py", "2902-2905",
                       "group.add_argument('--no-rope-fusion', action='store_false', ... dest='apply_rope_fusion')"),
    "fused.norm": _src(MLM, "megatron/training/argument_utils.py", "304",
                       "kw_args['persist_layer_norm'] = not args.no_persist_layer_norm"),
    "fused.grad_accumulation": _src(MLM, "megatron/training/arguments.py", "2944-2948",
                                    "group.add_argument('--no-gradient-accumulation-fusion', action='store_false', "
                                    "... dest='gradient_accumulation_fusion')"),
    "no fused cross_entropy": _src(MLM, "megatron/core/model_parallel_config.py", "320",
                                   "cross_entropy_loss_fusion: bool = False"),
    "grad_overlap": MEGATRON_README,
    "bucket": _src(MLM, "megatron/core/distributed/distributed_data_parallel.py", "134",
                   "ddp_config.bucket_size = max(40000000, 1000000 * dp_group.size())", 40000000),
    "bucket.per_rank": _src(MLM, "megatron/core/distributed/distributed_data_parallel.py", "134",
                            "ddp_config.bucket_size = max(40000000, 1000000 * dp_group.size())", 1000000),
    "bucket.first_stage_only": _src(MLM, "megatron/core/distributed/distributed_data_parallel.py", "170-171",
                                    "if disable_bucketing or pp_rank > 0: self.bucket_size = None"),
    "param_gather_overlap": MEGATRON_README,
    "tp_comm_overlap": MEGATRON_README,
    "tp_overlap_sms": _src(TE, "transformer_engine/pytorch/module/base.py", "384",
                           '"num_sm": 1 if method == "ring_exchange" else 16,', 16),
    "tp_overlap_splits": _src(TE, "transformer_engine/pytorch/module/base.py", "386",
                              '"num_splits": tp_size if method == "ring_exchange" else 4,', 4),
    "p2p_overlap": _src(MLM, "megatron/training/arguments.py", "3118-3120",
                        "group.add_argument('--no-overlap-p2p-communication', action='store_false', ... "
                        "dest='overlap_p2p_comm')"),
}
MEGATRON_CORE.update({
    "fused.adam": _src(MLM, "megatron/core/optimizer/__init__.py", "14",
                       "from transformer_engine.pytorch.optimizers import FusedAdam as Adam"),
    "dispatch": Source("flagos-ai/FlagGems issue #4812", "", "timings of tiny eager ops", "",
                       "stock PyTorch eager sigmoid/relu/abs/silu/gelu: ~7 us per call", 7, 1e-6),
    "launch": Source("pytorch/pytorch issue #161104", "", "a 1024-element x + y in a CUDA graph of 2000 calls", "",
                     "0.0011-0.0013 ms per op (the lower: the GPU's floor for a tiny kernel)", 0.0011, 1e-3),
})

MEGATRON_2021 = {
    "precision": _src(("NVIDIA/Megatron-LM v2.5", "e269e200"), "megatron/arguments.py", "151-155",
                      "if args.accumulate_allreduce_grads_in_fp32: assert args.DDP_impl == 'local'"),
    "attention": _src(("NVIDIA/Megatron-LM v2.5", "e269e200"), "megatron/model/transformer.py", "",
                      "matmul_result = torch.baddbmm(...); attention_probs = self.scale_mask_softmax(...)"),
    "fused.softmax": _src(("NVIDIA/Megatron-LM v2.5", "e269e200"), "megatron/arguments.py", "419-421",
                          "group.add_argument('--no-masked-softmax-fusion', action='store_false', ..."
                          "dest='masked_softmax_fusion')"),
    "fused.bias_act": _src(("NVIDIA/Megatron-LM v2.5", "e269e200"), "megatron/arguments.py", "424-426",
                           "group.add_argument('--no-bias-gelu-fusion', action='store_false', ..."
                           "dest='bias_gelu_fusion')"),
    "fused.bias_dropout_add": _src(("NVIDIA/Megatron-LM v2.5", "e269e200"), "megatron/arguments.py", "427-429",
                                   "group.add_argument('--no-bias-dropout-fusion', action='store_false', ..."
                                   "dest='bias_dropout_fusion')"),
    "fused.norm": _src(("NVIDIA/Megatron-LM v2.5", "e269e200"), "megatron/model/__init__.py", "16",
                       "from .fused_layer_norm import MixedFusedLayerNorm as LayerNorm"),
    "fused.adam": _src(("NVIDIA/Megatron-LM v2.5", "e269e200"), "megatron/optimizer/__init__.py", "",
                       "from apex.optimizers import FusedAdam as Adam"),
    "grad_overlap": _src(("NVIDIA/Megatron-LM v2.5", "e269e200"), "megatron/training.py", "360-370",
                         "# All-reduce if needed. if args.DDP_impl == 'local': ... model_module.allreduce_gradients()"),
    "p2p_overlap": _src(("NVIDIA/Megatron-LM v2.5", "e269e200"), "megatron/p2p_communication.py", "125-130",
                        "reqs = torch.distributed.batch_isend_irecv(ops); for req in reqs: req.wait(); "
                        "torch.cuda.synchronize()"),
    "dispatch": MEGATRON_CORE["dispatch"],
    "launch": MEGATRON_CORE["launch"],
}

PT = ("pytorch/pytorch", "cf30153c")
PT_RELEASE = ("pytorch/pytorch", "v2.13.0")  # the release the requirements pin, read as installed
PYTORCH_EAGER = {
    "precision": _src(TT, "torchtitan/config/job_config.py", "282, 290",
                      'mixed_precision_param: "bfloat16"; mixed_precision_reduce: "float32"'),
    "attention": _src(PT, "torch/nn/functional.py", "6417-6428",
                      "There are currently three supported implementations of scaled dot product attention: "
                      "FlashAttention-2 ... All implementations are enabled by default."),
    "flash_kernel": _src(("pytorch/pytorch", "001f694aef6f922b4fdf6d27d59162d27bf3df58"),
                         "aten/src/ATen/native/transformers/cuda/sdp_utils.cpp", "96-107, 120",
                         "// cuDNN 9.15.1 required for seq_len not divisible by 128 fix, CUDA <= 12.9 wheels "
                         "ship with older cuDNN ... return cudnn_version > 91500 && (major == 9 || major == 10) "
                         "...; // flash_attention V2 is universally faster than efficient_attention and Math"),
    "fused.norm": Source("pytorch/pytorch", "", "aten/src/ATen/native/native_functions.yaml", "",
                         "rms_norm, _fused_rms_norm and _fused_rms_norm_backward (one kernel each way; "
                         "torch's layer_norm likewise)"),
    "fused.adam": _src(TT, "torchtitan/components/optimizer.py", "",
                       "torch.optim.AdamW with foreach=True: one multi-tensor update per group"),
    "no fused rope": _src(TT, "torchtitan/models/llama3/model.py", "",
                          "xq_ = torch.view_as_complex(xq.float().reshape(...)); xq_out = "
                          "torch.view_as_real(xq_ * freqs_cis).flatten(3); xq_out.type_as(xq)"),
    "no fused cross_entropy": _src(TT, "torchtitan/components/loss.py", "57-61",
                                   "return torch.nn.functional.cross_entropy(pred.float(), labels, ...)"),
    "grad_overlap": _src(PT, "torch/nn/parallel/distributed.py", "1434-1439",
                         "self.reducer = dist.Reducer(parameters, list(reversed(bucket_indices)), ..."),
    "bucket": _src(PT, "torch/nn/parallel/distributed.py", "",
                   "bucket_cap_mb=None ... (default 25)", 25, 2**20),
    "bucket.first": _src(PT, "torch/distributed/constants.py", "",
                         "_DEFAULT_FIRST_BUCKET_BYTES = int(1024 * 1024)", 1024, 1024),
    "fsdp_prefetch": _src(PT, "torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py", "87-89",
                          "# All-gather stream allows overlapping next all-gather with current forward compute"),
    "dispatch": MEGATRON_CORE["dispatch"],
    "launch": MEGATRON_CORE["launch"],
    "keep_gathered_input": _src(TT_BENCH, "torchtitan/parallelisms/parallelize_llama.py", "177-181",
                                '"attention": prepare_module_input(input_layouts=(Shard(1), None), '
                                'desired_input_layouts=(Replicate(), None)), "attention.wq": colwise_parallel()'),
    "op_checkpoint": _src(TT_BENCH, "torchtitan/parallelisms/parallelize_llama.py", "213-276",
                          "# Saves output of all compute ops, except every second mm"),
    "fsdp_unsharded_in_pipeline": _src(PT_RELEASE, "torch/distributed/pipelining/stage.py", "844-847, 1164-1191",
                                       "elif isinstance(self.submod, FSDPModule): "
                                       "self.submod.set_is_last_backward(False); "
                                       "self.submod.set_reshard_after_backward(False); "
                                       "self.submod.set_requires_gradient_sync(False) ... def perform_reduce_grad"
                                       "(...): REDUCE_GRAD action is scheduled after all microbatches W, B actions"),
    "fsdp_unsharded_in_pipeline.forward": _src(TT_BENCH, "torchtitan/parallelisms/parallelize_llama.py", "326-329",
                                               "if pp_enabled: # For PP, do not reshard after forward to avoid "
                                               "per-microbatch all-gathers ... reshard_after_forward = False"),
    "fsdp_unsharded_in_pipeline.grads": _src(PT_RELEASE, "torch/distributed/fsdp/_fully_shard/_fsdp_param.py",
                                             "802-813", "self.unsharded_accumulated_grad = "
                                             "unsharded_grad.to(self.reduce_dtype)"),
}

PYTORCH_COMPILE = dict(PYTORCH_EAGER)
PYTORCH_COMPILE.update({
    "fused.elementwise": Source("J. Ansel et al., PyTorch 2 (ASPLOS 2024)", "", "abstract", "",
                                "TorchInductor ... translates PyTorch programs into OpenAI's Triton for GPUs"),
    "dispatch": Source("meta-pytorch/tritonbench PR #1017", "", "per-kernel launch overhead of Inductor", "",
                       "Inductor CachingAutotuner.run 6.8 us", 6.8, 1e-6),
})
