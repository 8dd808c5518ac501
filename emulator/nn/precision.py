"""Mixed precision: bf16 parameters are used in fp32 (forward and backward run in fp32;
only storage and communication are bf16)."""

import numpy as np
from ml_dtypes import bfloat16


def upcast(params):
    """The parameters as the layers compute with them: bf16 arrays in fp32, others as they are."""
    return {k: v.astype(np.float32) if v.dtype == bfloat16 else v for k, v in params.items()}
