"""How NumPy shapes what it computes, as pure functions of shapes and dtypes (no values):
what :mod:`emulator.arrays.shape_only`'s arrays answer with."""

import math
from functools import lru_cache

import numpy as np


@lru_cache(maxsize=8192)
def c_strides(shape, itemsize):
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def dtype_token(a):
    """What decides a ufunc's result dtype: an array's dtype, or a Python scalar's type."""
    if isinstance(a, (np.ndarray, np.generic)) or (hasattr(a, "dtype") and hasattr(a, "shape")):
        return a.dtype
    return type(a)  # Python scalars stay weak (NEP 50)


@lru_cache(maxsize=4096)
def ufunc_dtypes(ufunc, tokens, dtype):
    shape = (1, 1) if ufunc is np.matmul else ()
    dummies = [np.zeros(shape, t) if isinstance(t, np.dtype) else t(0) for t in tokens]
    with np.errstate(all="ignore"):
        out = ufunc(*dummies, **({"dtype": dtype} if dtype is not None else {}))
    out = out if isinstance(out, tuple) else (out,)
    return tuple(np.asarray(o).dtype for o in out)


@lru_cache(maxsize=4096)
def matmul_shape(a, b):
    if len(a) == 1:
        a = (1,) + a
        drop_a = True
    else:
        drop_a = False
    drop_b = len(b) == 1
    if drop_b:
        b = b + (1,)
    if a[-1] != b[-2]:
        raise ValueError(f"matmul: shapes {a} and {b} do not align")
    shape = np.broadcast_shapes(a[:-2], b[:-2]) + (a[-2], b[-1])
    if drop_a:
        shape = shape[:-2] + shape[-1:]
    if drop_b:
        shape = shape[:-1]
    return shape


def _index_key(i):
    """A hashable stand-in for one basic index, its type kept (``True`` is not ``1``)."""
    return (slice, i.start, i.stop, i.step) if type(i) is slice else (type(i), i)


def _from_key(k):
    return slice(*k[1:]) if k[0] is slice else k[1]


def basic_index(shape, strides, index):
    """(shape, strides, first byte) of ``x[index]`` for basic indexing (ints, slices,
    ``None``, ``...``): NumPy's own view of a 1-byte buffer with those strides; nothing is
    read. Each (shape, strides, index) is worked out once."""
    try:
        key = tuple(_index_key(i) for i in index)
        hash(key)
    except TypeError:  # an index NumPy may still take (its error, if not) but that cannot be a key
        return _basic_index(shape, strides, index)
    return _basic_index_of(shape, strides, key)


@lru_cache(maxsize=8192)
def _basic_index_of(shape, strides, key):
    return _basic_index(shape, strides, tuple(_from_key(k) for k in key))


def _basic_index(shape, strides, index):
    dummy = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), shape=shape, strides=strides)
    view = dummy[index]
    return view.shape, view.strides, view.__array_interface__["data"][0] - dummy.__array_interface__["data"][0]


def advanced_shape(shape, index, unknown=lambda x: False):
    """The shape NumPy gives ``x[index]`` when the index holds arrays (boolean masks of
    unknown values select every element they cover)."""
    out, arrays, dims, i, placed = [], [], list(shape), 0, None
    n_ellipsis_dims = len(shape) - sum(1 for x in index if x is not None and x is not Ellipsis) - sum(
        len(x.shape) - 1 for x in index if hasattr(x, "dtype") and x.dtype == bool)
    for x in index:
        if x is Ellipsis:
            out += dims[i:i + n_ellipsis_dims]
            i += n_ellipsis_dims
        elif x is None:
            out.append(1)
        elif isinstance(x, slice):
            out.append(len(range(*x.indices(dims[i]))))
            i += 1
        elif isinstance(x, (np.ndarray, list)) or unknown(x):
            x = np.asarray(x) if isinstance(x, list) else x
            if x.dtype == bool:
                count = math.prod(x.shape) if unknown(x) else int(x.sum())
                arrays.append((count,))
                i += x.ndim
            else:
                arrays.append(x.shape)
                i += 1
            if placed is None:
                placed = len(out)
        else:  # an integer
            arrays.append(())
            if placed is None:
                placed = len(out)
            i += 1
    out += dims[i:]
    adv = list(np.broadcast_shapes(*arrays)) if arrays else []
    return tuple(out[:placed] + adv + out[placed:]) if placed is not None else tuple(out)
