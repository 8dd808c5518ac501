"""Mixed precision: bf16 parameters are used in fp32 (forward and backward run in fp32;
only storage and communication are bf16)."""

import numpy as np
from ml_dtypes import bfloat16


def upcast(params):
    """The parameters as the layers compute with them: bf16 arrays in fp32, others as they are."""
    return {k: v.astype(np.float32) if v.dtype == bfloat16 else v for k, v in params.items()}


def computed(array):
    """An array as the layers compute with it: a bf16 or fp16 one in fp32, another as it is."""
    return array.astype(np.float32) if array.dtype in (bfloat16, np.float16) else array
