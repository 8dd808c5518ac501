"""One rank's share of an ``nn.GPT`` on a mesh: its layers as modules that talk over the
rank's groups, the placement of every parameter, and the loss.

:class:`RankModel` has the pipeline's view of a model (``layers``, ``boundary``,
``loss``, ``loss_backward``), so a :class:`~emulator.parallel.pipeline.PipelineStage`
runs it as it runs an ``nn.GPT``:

* ``embed`` (:class:`ParallelEmbedding`): the token table split by vocabulary over ``tp``
  (Megatron's vocab-parallel embedding: each rank looks up the ids in its range, a
  reduction over tp sums them; under sequence parallelism a reduce-scatter, so each rank
  keeps its slice of the sequence), plus the position table at this rank's positions
  (context parallelism's layout decides which);
* ``blocks.i``: :class:`~emulator.parallel.tensor_parallel.block.TensorParallelBlock`, with ring or
  Ulysses attention over ``cp`` and experts over ``ep``;
* ``head`` (:class:`ParallelHead`): the final norm, then the output layer split by
  vocabulary (column-parallel; its input gathered along the sequence under SP), and the
  vocab-parallel cross-entropy (:mod:`.tensor_parallel.vocab`: three numbers per token cross
  the tp ranks, never the logits).
"""

import numpy as np

from ..errors import ConfigError
from ..machine import elementwise
from ..machine.work import Collective, Gemm, Memory, Work, dtype_bytes, np_dtype
from ..nn.layernorm import layer_norm, layer_norm_backward
from ..nn.moe import MoE
from .attention_cores import RingCore, UlyssesCore
from .context_parallel.layout import positions
from .expert_parallel import ParallelMoE, TokenGroup
from .layer_shape import LayerShape
from .placement import Placement
from .tensor_parallel.block import TensorParallelBlock
from .tensor_parallel.regions import TPRegions
from .tensor_parallel.regions_work import (region_gather, region_gather_again, region_gather_back, region_reduce,
                                           region_reduce_back, wgrad)
from .tensor_parallel.vocab import (vocab_parallel_cross_entropy, vocab_parallel_embedding_backward,
                                    vocab_parallel_lookup)


class ParallelEmbedding:
    """x = tok[ids] + pos[positions]: ids (b, n) this rank's tokens (its cp shard);
    out (b, n, d), or (b, n/t, d) under sequence parallelism."""

    charges_itself = True

    def __init__(self, regions, vocab, d_model, cp_rank, cp_size, layout, dtype=np.float32):
        self.r, self.vocab, self.d, self.dtype = regions, vocab, d_model, dtype
        self.cp_rank, self.cp_size, self.layout = cp_rank, cp_size, layout

    def placements(self):
        sp = ("tp",) if self.r.sp else ()
        return {"tok.w": Placement((("tp", 0),)), "pos.w": Placement(partial=sp)}

    def _positions(self, n):
        return positions(self.cp_rank, self.cp_size, n, self.layout) if self.cp_size > 1 else np.arange(n)

    def work(self, ids_shape):
        b, n = ids_shape
        s = _shape(self.r, b, n, self.d, vocab=self.vocab)
        return embedding_work(s, self.r.comm.work_context(self.dtype))

    def forward(self, P, ids):
        with self.r.comm.declared(lambda: self.work(np.shape(ids)).forward, "embedding forward"):
            part, cache = vocab_parallel_lookup(self.r.comm, P["tok.w"], ids, self.vocab)
            self.r.comm.charge("embed: lookup")
            tok = self.r.reduce(part)  # the ranks' rows summed: all-reduce, or reduce-scatter along the sequence
            pos = self._positions(ids.shape[1])
            if self.r.sp:
                pos = pos[self.r.sequence_slice(len(pos))]
            cache["pos"], cache["ids shape"] = pos, np.shape(ids)
            self.r.comm.charge("embed: positions")
            return tok + P["pos.w"][pos], cache

    def backward_input(self, P, cache, dy):
        return None

    def backward_weight(self, P, cache, dy):
        with self.r.comm.declared(lambda: self.work(cache["ids shape"]).backward_weight, "embedding backward (W)"):
            g_tok = vocab_parallel_embedding_backward(P["tok.w"], cache, self.r.reduce_back(dy))  # whole sequence's
            self.r.comm.charge("embed: table grad")
            g_pos = np.zeros_like(P["pos.w"], dtype=dy.dtype)
            np.add.at(g_pos, cache["pos"], dy.sum(0))
            self.r.comm.charge("embed: positions grad")
            return {"tok.w": g_tok, "pos.w": g_pos}

    def flops(self, shape):
        return {"forward": 0, "backward_input": 0, "backward_weight": 0}


class ParallelHead:
    """logits = LN(x) @ W, W (d, vocab) split by vocabulary: this rank's columns (b, n, V/t)."""

    charges_itself = True

    def __init__(self, regions, d_model, vocab, dtype=np.float32):
        self.r, self.d, self.vocab, self.dtype = regions, d_model, vocab, dtype
        self.keep_gathered = regions.sp and regions.comm.stack.keep_gathered_input  # as the blocks keep theirs

    def placements(self):
        sp = ("tp",) if self.r.sp else ()
        return {"ln.g": Placement(partial=sp), "ln.b": Placement(partial=sp), "proj.w": Placement((("tp", 1),))}

    def work(self, x_shape):
        b, s_loc = x_shape[0], x_shape[1]
        s = _shape(self.r, b, s_loc * self.r.comm.size if self.r.sp else s_loc, self.d, vocab=self.vocab)
        return head_work(s.replace(keep_gathered=self.keep_gathered), self.r.comm.work_context(self.dtype))

    def forward(self, P, x):
        with self.r.comm.declared(lambda: self.work(np.shape(x)).forward, "head forward"):
            self.r.comm.charge("final norm")
            h = layer_norm(x, P["ln.g"], P["ln.b"])
            hg = self.r.gather(h)  # the whole sequence under SP; f (identity) without
            self.r.comm.charge("head: output layer")
            return hg @ P["proj.w"], {"x": x, "h": hg if self.keep_gathered else h}

    def backward_input(self, P, cache, dlogits):
        with self.r.comm.declared(lambda: self.work(np.shape(cache["x"])).backward_input, "head backward (B)"):
            self.r.comm.charge("head: output layer dgrad")
            dh = self.r.gather_back(dlogits @ P["proj.w"].T)
            dx, cache["ln.g"], cache["ln.b"] = layer_norm_backward(cache["x"], P["ln.g"], dh)
            self.r.comm.charge("final norm backward")
            cache["dlogits"] = dlogits
            return dx

    def backward_weight(self, P, cache, dlogits):
        if "dlogits" not in cache:
            self.backward_input(P, cache, dlogits)
        with self.r.comm.declared(lambda: self.work(np.shape(cache["x"])).backward_weight, "head backward (W)"):
            hg = cache["h"] if self.keep_gathered else self.r.gather(cache["h"])  # gathered again, as the blocks do
            rows = hg.shape[0] * hg.shape[1]
            self.r.comm.charge("head: output layer wgrad")
            return {"proj.w": hg.reshape(rows, -1).T @ cache.pop("dlogits").reshape(rows, -1),
                    "ln.g": cache.pop("ln.g"), "ln.b": cache.pop("ln.b")}

    def flops(self, shape):
        return {"forward": 0, "backward_input": 0, "backward_weight": 0}


class RankModel:
    """This rank's share of ``gpt`` (an ``nn.GPT``) for ``dims`` (a ParallelDims), its
    groups in ``comms`` (``tp``, ``cp``, ``ep``: Comm objects)."""

    def __init__(self, gpt, dims, comms):
        self.gpt, self.dims = gpt, dims
        self.d_model, self.dtype, self.vocab = gpt.d_model, gpt.dtype, gpt.vocab
        tp, cp, ep = comms["tp"], comms["cp"], comms["ep"]
        self.tp, self.cp, self.ep = tp, cp, ep
        ctx = tp.work_context(gpt.dtype)
        self.act = np_dtype(ctx.dtype("activations"))  # what the layers keep (the policy's, or the model's)
        self.handed = np_dtype(ctx.dtype("pp"))  # what one layer hands the next, and a stage the next
        regions = TPRegions(tp, dims.sequence_parallel, np_dtype(ctx.dtype("tp")))
        self.regions = regions
        self.layers = [("embed", ParallelEmbedding(regions, gpt.vocab, gpt.d_model, cp.rank, cp.size,
                                                   dims.cp_layout, gpt.dtype))]
        for i in range(gpt.n_layers):
            self.layers.append((f"blocks.{i}", self._block(gpt, dims, regions, tp, cp, ep)))
        self.layers.append(("head", ParallelHead(regions, gpt.d_model, gpt.vocab, gpt.dtype)))

    def _block(self, gpt, dims, regions, tp, cp, ep):
        core = None
        if cp.size > 1:
            core = (RingCore if dims.cp_attention == "ring" else UlyssesCore)(cp, True, dims.cp_layout)
        mlp = gpt.mlp
        if gpt.n_experts:
            moe = MoE(gpt.d_model, gpt.d_ff, gpt.n_experts, gpt.top_k, gpt.capacity_factor, gpt.aux_loss_coef,
                      dtype=gpt.dtype, mlp=gpt.mlp)
            layout = dims.cp_layout

            def group(batch, seq):  # the tokens of one micro-batch of one data-parallel replica
                return TokenGroup.sequence(cp, batch, seq, layout) if cp.size > 1 else TokenGroup.local(cp, batch * seq)

            mlp = ParallelMoE(moe, ep, regions, group, dtype=gpt.dtype)
        return TensorParallelBlock(tp, gpt.d_model, gpt.n_heads, gpt.d_ff, causal=True,
                                   sequence_parallel=dims.sequence_parallel, act_dtype=self.act,
                                   recompute=dims.recompute if dims.recompute in ("selective", "op") else "none",
                                   n_kv_heads=gpt.n_kv_heads, mlp=mlp, core=core, reduce_partial_grads=False)

    # ----------------------------------------------------------------- the pipeline's view
    def boundary(self, ids_shape):
        b, n = ids_shape
        return (b, n // self.tp.size if self.dims.sequence_parallel else n, self.d_model), self.handed

    def loss_work(self, logits_shape):
        b, n = logits_shape[0], logits_shape[1]
        s = _shape(self.regions, b, n, self.d_model, vocab=self.vocab)
        return loss_work(s, self.tp.work_context(self.dtype))

    def loss(self, logits_shard, y):
        with self.tp.declared(lambda: self.loss_work(np.shape(logits_shard)).forward, "loss"):
            # in the loss dtype (fp32 under bf16), as Megatron without --fp16-lm-cross-entropy and torchtitan's
            # cross_entropy(pred.float(), ...) compute it
            dt = self._loss_dtype()
            logits = logits_shard if dt is None else logits_shard.astype(dt, copy=False)
            loss, grad = vocab_parallel_cross_entropy(self.tp, logits, y, self.vocab, dt)
            self.tp.charge("loss")
            return loss, (grad, np.shape(logits_shard))

    def _loss_dtype(self):
        return np_dtype(self.tp.work_context(self.dtype).dtype("loss")) if self.tp.precision else None

    def loss_backward(self, cache, scale):
        grad, shape = cache
        with self.tp.declared(lambda: self.loss_work(shape).backward_input, "loss backward"):
            self.tp.charge("loss backward")
            return grad * scale

    # ----------------------------------------------------------------- where parameters live
    def placements(self, names=None):
        """{"layer.key": Placement} for the layers ``names`` (default: all)."""
        out = {}
        for name, layer in self.layers:
            if names is None or name in names:
                out.update({f"{name}.{k}": v for k, v in layer.placements().items()})
        return out

    def coords(self):
        return {"tp": self.tp.rank, "ep": self.ep.rank}

    def sizes(self):
        return {"tp": self.tp.size, "ep": self.ep.size}


def check_model(gpt):
    for name in ("vocab", "d_model", "n_heads", "d_ff", "n_layers", "max_seq"):
        if not hasattr(gpt, name):
            raise ConfigError(f"run_on_mesh needs an nn.GPT (or a model with its attributes); {gpt!r} has no {name}")


# ----------------------------------------------------------------- the declarations of their work
def _shape(regions, b, n, d, vocab):
    """The shape of a vocabulary-parallel layer: ``n`` positions (the whole local sequence)."""
    return LayerShape(b, n, d, 1, 1, 1, vocab, tp=regions.comm.size, sp=regions.sp)


def embedding_work(s, ctx, learned=True):
    """The vocabulary-parallel lookup (this rank's rows of the table), the reduction over tp,
    the position table's rows added; backward the table's gradient (a scatter-add)."""
    c, p = ctx.dtype("compute"), ctx.dtype("params")
    cb, pb = dtype_bytes(c), dtype_bytes(p)
    F = (Memory("embed: lookup", "embedding", s.rows * (s.d * pb + 8), s.rows * s.d * cb),) + \
        region_reduce(s, ctx, "embed")
    if learned:
        F += (Memory("embed: positions", "embedding", s.rows_sp * s.d * (cb + pb), s.rows_sp * s.d * cb),)
    g = dtype_bytes(ctx.dtype("grads"))
    W = region_reduce_back(s, ctx, "embed") + (Memory("embed: table grad", "embedding", s.rows * (s.d * cb + 8),
                                                      s.rows * s.d * g),)
    if learned:
        W += (Memory("embed: positions grad", "embedding", s.rows_sp * s.d * cb, s.rows_sp * s.d * g),)
    return Work("embed", F, (), W, F)


def head_work(s, ctx):
    """The final norm, the output layer split by vocabulary (its input gathered under SP),
    backward its input gradient (reduced over tp) and the norm's; W the output layer's
    weight gradient (the input gathered again under SP)."""
    st, a, p, c = ctx.stack, ctx.dtype("activations"), ctx.dtype("params"), ctx.dtype("compute")
    v = s.vocab // s.tp
    F = elementwise.norm_forward(st, "final norm", s.rows_sp, s.d, a, p, s.norm) + region_gather(s, ctx, "head") + \
        (Gemm("head: output layer", s.rows, v, s.d, c),)
    B = (Gemm("head: output layer dgrad", s.rows, s.d, v, c),) + region_gather_back(s, ctx, "head") + \
        elementwise.norm_backward(st, "final norm", s.rows_sp, s.d, a, p, s.norm)
    W = region_gather_again(s, ctx, "head") + wgrad(ctx, "head: output layer wgrad", s.d, v, s.rows)
    return Work("head", F, B, W, F)


def loss_work(s, ctx):
    """The vocabulary-parallel cross-entropy over this rank's logits (:mod:`.tensor_parallel.vocab`):
    its kernels as the stack runs them (:func:`emulator.machine.elementwise.cross_entropy`)
    and three all-reduces over tp of one number per token (max, sum of exponentials,
    target logit) in the policy's loss dtype."""
    F, B = elementwise.cross_entropy(ctx.stack, s.rows, s.vocab // s.tp, ctx.dtype("compute"))
    if s.tp > 1:
        dt = ctx.dtype("loss")
        F += tuple(Collective(f"loss: all-reduce {what}", "all_reduce", "tp", s.tp, s.rows * dtype_bytes(dt), dt)
                   for what in ("max", "sum of exponentials", "target logit"))
    return Work("loss", F, B, (), ())
