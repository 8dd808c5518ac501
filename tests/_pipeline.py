"""What the pipeline tests share: a network that costs nothing, and a tiny GPT."""

import numpy as np

from emulator import Topology, nn

FREE = Topology.free_network()


def tiny(layers, dtype=np.float64, d=4):
    model = nn.GPT(vocab=8, d_model=d, n_heads=1, d_ff=d, n_layers=layers, max_seq=4, dtype=dtype)
    return model, model.init(np.random.default_rng(0))
