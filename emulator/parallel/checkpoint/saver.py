"""A run's saves and its restart, as ``run_on_mesh`` drives them from every rank's program.

:class:`Saver`: the folder claimed once, before the first step (:func:`~.folder.claim`);
the write plan made at the first save (:class:`~.files.Coordinator`); after each step the
policy names, each rank charges its write on the emulated clock (:mod:`.storage`) and
writes its shard; the rank whose shard completes the save writes the manifest, then and
there. So a save is on disk, complete, as soon as its last shard is, whatever happens to
the run afterwards. After a simulated failure, :meth:`Saver.after_failure` marks the saves
the emulated job lost (:func:`~.files.lost_reason`).

:class:`Restart`: loading a rank of a new mesh from a checkpoint, its reads charged on the
clock.
"""

from ...errors import ConfigError
from .checkpointing import Checkpointing
from .durable import make_folder
from .files import Coordinator, clear_partial, lost_reason, mark_lost, step_dir, write_manifest, write_shard
from .folder import claim
from .loading import Checkpoint
from .pieces import STATE, load_optimizer, load_params, rank_pieces
from .storage import Storage, charge_load, charge_write, close_save


class Saver:
    """The saves of a run of ``world_size`` ranks under ``policy`` (a folder or a
    :class:`~emulator.parallel.checkpoint.Checkpointing`); ``run``: what each manifest
    records of the run (:func:`~.fit.run_record`); ``first_step`` and ``resumed_from``
    (a save's folder): where the run starts, which says what in the folder is in its way."""

    def __init__(self, policy, world_size, run, first_step=0, resumed_from=None):
        self.policy, self.world_size, self.run = Checkpointing.of(policy), world_size, run
        self.coordinator = Coordinator()
        self.parts = {}  # step -> {rank: its write result}, until the save's manifest is written
        self.saved = []  # (folder, manifest) of each save this run completed, in order
        self.replaced = claim(self.policy.path, self.policy.overwrite, first_step, resumed_from)

    def after_step(self, comm, hooks, placements, coords, sizes, train, last):
        if not self.policy.due(train.step, last):
            return
        pieces, optim_t = rank_pieces(hooks, placements, coords, sizes)
        rank = comm.global_rank
        if self.coordinator.writer is None:  # the first save plans: every rank's list to the coordinator, back
            self.coordinator.register(rank, pieces)
            comm.barrier()
        mine = [p for p in pieces if self.coordinator.writes(rank, (p.fqn, p.offsets, p.sizes))]
        end = charge_write(comm, sum(p.nbytes for p in mine), self.policy.storage, self.policy.async_save)
        folder = step_dir(self.policy.path, train.step)
        parts = self.parts.setdefault(train.step, {})
        if not parts:  # the save's first shard: what a crash or a lost save left in its folder goes
            clear_partial(folder)
            make_folder(folder)
        parts[rank] = write_shard(folder, rank, train.step, mine, train.saved(optim_t), end)
        if len(parts) == self.world_size:
            self.saved.append((folder, write_manifest(folder, self.parts.pop(train.step), self.world_size, self.run)))
        close_save(comm, self.policy.async_save)

    def folders(self):
        """The folders of the saves this run completed."""
        return [folder for folder, _ in self.saved]

    def after_failure(self, ends):
        """A simulated failure stopped the run (``ends[r]``: when rank r stopped, on its
        clock): mark the saves the emulated job lost; return the folders of the others."""
        kept = []
        for folder, manifest in self.saved:
            reason = lost_reason(manifest, ends)
            if reason is None:
                kept.append(folder)
            else:
                mark_lost(folder, reason)
        return kept


class Restart:
    """Loading a rank of a new mesh from ``checkpoint`` (a :class:`~.loading.Checkpoint`
    or its folder). ``dtypes``: the model's parameter dtypes, to cast the saved ones to
    (a change of precision the caller allowed; None: as saved)."""

    def __init__(self, checkpoint, storage=None, dtypes=None):
        self.checkpoint = checkpoint if isinstance(checkpoint, Checkpoint) else Checkpoint(checkpoint)
        self.storage = storage or Storage()
        self.dtypes = dtypes
        self.shapes = {k[len("model."):]: tuple(t["shape"]) for k, t in self.checkpoint.tensors.items()
                       if k.startswith("model.")}
        self._bytes = {}  # rank -> bytes of parameters it read

    def _reader(self, reads):
        def read(fqn, offsets, sizes_):
            reads.append(self.checkpoint.read(fqn, offsets, sizes_))
            return reads[-1]

        return read

    def params(self, comm, placements, coords, sizes):
        reads = []
        local = load_params(self._reader(reads), placements, coords, sizes, self.shapes)
        self._bytes[comm.global_rank] = sum(a.nbytes for a in reads)
        if self.dtypes is None:
            return local
        return {k: v if v.dtype == self.dtypes[k] else v.astype(self.dtypes[k]) for k, v in local.items()}

    def optimizer(self, comm, hooks, placements, coords, sizes):
        reads = []
        kinds = [k for k in STATE if self.checkpoint.has(f"optim.{k}.")]  # master weights it lacks stay fresh
        if "m" not in kinds or "v" not in kinds:
            raise ConfigError(f"checkpoint {self.checkpoint.path} holds no optimizer moments; save it again")
        load_optimizer(self._reader(reads), hooks, placements, coords, sizes, self.checkpoint.train["optim_t"], kinds)
        charge_load(comm, self._bytes.pop(comm.global_rank) + sum(a.nbytes for a in reads), self.storage)
