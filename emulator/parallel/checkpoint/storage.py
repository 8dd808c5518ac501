"""Where checkpoints go, and what saving costs on the emulator's clock.

``Storage(write_bandwidth, read_bandwidth, host_bandwidth)``: bytes per second *each GPU*
gets from the checkpoint storage when every GPU of the job writes (or reads) at once, and
the bandwidth of the copy from GPU memory to host memory.

The default is Llama 3's: its checkpoints went to Meta's Tectonic file system, 240 PB on
7,500 SSD servers with a sustained throughput of 2 TB/s and peaks of 7 TB/s, each GPU
saving its own state, between 1 MB and 4 GB (Llama 3 paper, "The Llama 3 Herd of Models",
arXiv 2407.21783, section 3.3.1, Storage). Shared by the 16,384 GPUs of its largest run,
2 TB/s is about 122 MB/s per GPU. The host copy runs over the GPU's PCIe Gen5 x16 link:
128 GB/s both ways together (NVIDIA H100 datasheet), 64 GB/s one way.

Two ways to save (:func:`charge_save`), as ``torch.distributed.checkpoint`` offers:

* **synchronous** (``dcp.save``): training stops while the rank writes its bytes, and
  the save ends when the slowest writer is done (a collective closes it);
* **asynchronous** (``dcp.async_save``): the rank copies its state to host memory
  (training stops only for that copy), then a background writer sends it to storage
  while training goes on. The checkpoint exists only once every writer is done; the next
  save first waits for the previous one's writer (its host buffer is reused).
"""

from dataclasses import dataclass

from ...errors import ConfigError

LLAMA3_STORAGE_SUSTAINED = 2e12  # bytes/s, Tectonic's sustained throughput (section 3.3.1)
LLAMA3_STORAGE_PEAK = 7e12  # bytes/s, its peak
LLAMA3_GPUS = 16384  # the largest Llama 3 405B pretraining run
PCIE_GEN5_ONE_WAY = 64e9  # bytes/s: 128 GB/s both directions (H100 datasheet)


@dataclass(frozen=True)
class Storage:
    """Per GPU: ``write_bandwidth`` and ``read_bandwidth`` to checkpoint storage, and
    ``host_bandwidth`` for the copy to host memory (bytes/s)."""

    write_bandwidth: float = LLAMA3_STORAGE_SUSTAINED / LLAMA3_GPUS
    read_bandwidth: float = LLAMA3_STORAGE_SUSTAINED / LLAMA3_GPUS
    host_bandwidth: float = PCIE_GEN5_ONE_WAY

    def __post_init__(self):
        for name in ("write_bandwidth", "read_bandwidth", "host_bandwidth"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v > 0):
                raise ConfigError(f"Storage: {name} is in bytes per second per GPU and must be positive, got {v!r}")

    @classmethod
    def shared(cls, aggregate, gpus, host_bandwidth=PCIE_GEN5_ONE_WAY):
        """A file system of ``aggregate`` bytes/s shared by ``gpus`` GPUs writing at once."""
        return cls(aggregate / gpus, aggregate / gpus, host_bandwidth)

    def write_seconds(self, nbytes):
        return nbytes / self.write_bandwidth

    def read_seconds(self, nbytes):
        return nbytes / self.read_bandwidth

    def copy_seconds(self, nbytes):
        return nbytes / self.host_bandwidth


def charge_write(comm, nbytes, storage, async_save):
    """Charge this rank's write of ``nbytes`` on its clock; return when its bytes are on
    storage. Synchronous: on the compute stream (then :func:`close_save`). Asynchronous:
    wait for the previous save's writer, copy to host on the compute stream, write in
    the background on the ``storage`` stream."""
    if async_save:
        comm.wait_storage("previous checkpoint write")
        comm.storage(storage.copy_seconds(nbytes), "checkpoint: copy to host")
        return comm.storage(storage.write_seconds(nbytes), "checkpoint write", background=True)
    return comm.storage(storage.write_seconds(nbytes), "checkpoint write")


def close_save(comm, async_save):
    """A synchronous save ends when the slowest writer is done (``dcp.save`` closes with
    a collective: here a barrier); an asynchronous one closes in the background."""
    if not async_save:
        comm.barrier()


def charge_load(comm, nbytes, storage):
    """Charge this rank's read of ``nbytes`` from storage (a restart)."""
    return comm.storage(storage.read_seconds(nbytes), "checkpoint read")
