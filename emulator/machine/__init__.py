"""The machine model: nodes, NVLink and NICs, NCCL's channels (``topology``), and the ports
every message is charged on (``links``)."""
