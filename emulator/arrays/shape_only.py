"""Arrays with a shape and a dtype and no values: the same per-rank programs, run without data.

A :class:`ShapeArray` answers to NumPy as an array does (``__array_ufunc__``,
``__array_function__``, the ndarray methods a layer calls), and every result is another
ShapeArray with the shape and dtype NumPy would give. Nothing is computed and nothing is
allocated, so a layer of Llama 3 405B costs microseconds; what the emulator charges comes
from shapes anyway: compute from the kernels' shapes, the ledger from ``nbytes``,
collectives from bytes. Views keep NumPy's memory identity (the same base, offset and
strides for reshapes, transposes and slices), so the ledger counts a tensor cached twice
once, exactly as it does for real arrays.

What depends on values is decided without them: a router's choice is balanced (token i's
j-th expert is ``(i + j) mod E``), a boolean mask selects nothing, a loss is NaN.
Everything else that would need values (``float()`` of a sum, ``np.asarray``) raises
:class:`ShapeOnlyError`, saying so.
"""

import math

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from ..errors import ConfigError
from .shape_rules import advanced_shape, basic_index, c_strides, dtype_token, matmul_shape, ufunc_dtypes


# The NumPy functions a ShapeArray answers to, {np function: handler}: filled by
# :mod:`emulator.arrays.shape_only_functions`, a module of its own.
FUNCTIONS = {}


class ShapeOnlyError(ConfigError):
    """Something needed the values of a shape-only array."""


class _Base:
    """The identity of a block of (imaginary) memory, shared by an array and its views."""

    __slots__ = ()


class ShapeArray(NDArrayOperatorsMixin):
    __array_priority__ = 1000

    __slots__ = ("shape", "dtype", "_strides", "offset", "base")

    def __init__(self, shape, dtype, strides=None, offset=0, base=None):
        self.shape = tuple(shape) if type(shape) is tuple else tuple(int(n) for n in shape)
        self.dtype = dtype if type(dtype) is np.dtype else np.dtype(dtype)
        self._strides = None if strides is None else tuple(strides)  # None: C-contiguous
        self.offset, self.base = offset, base or _Base()

    @property
    def strides(self):
        return c_strides(self.shape, self.dtype.itemsize) if self._strides is None else self._strides

    # ----------------------------------------------------------------- what an array says about itself
    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: math.prod(self.shape))
    itemsize = property(lambda self: self.dtype.itemsize)
    nbytes = property(lambda self: self.size * self.dtype.itemsize)
    T = property(lambda self: self.transpose())

    @property
    def memory_key(self):
        """What the ledger uses to count a tensor once: (base, first byte, bytes)."""
        return (id(self.base), self.offset, self.nbytes)

    def __repr__(self):
        return f"ShapeArray(shape={self.shape}, dtype={self.dtype})"

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d shape-only array")
        return self.shape[0]

    def __array__(self, dtype=None, copy=None):
        raise ShapeOnlyError(f"a shape-only array ({self.shape}, {self.dtype}) has no values to convert; the code "
                             f"asked for them (np.asarray, np.array, or a NumPy function that is not supported)")

    def __float__(self):
        return float("nan")

    def __bool__(self):
        raise ShapeOnlyError("the truth value of a shape-only array is unknown: a decision depends on data")

    def item(self):
        return float("nan")

    # ----------------------------------------------------------------- views
    def _view(self, shape, strides, offset=None):
        return ShapeArray(shape, self.dtype, strides, self.offset if offset is None else offset, self.base)

    def _contiguous(self):
        return self._strides is None or self._strides == c_strides(self.shape, self.itemsize)

    def reshape(self, *shape, order="C"):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        shape = list(shape)
        if -1 in shape:
            known = math.prod(n for n in shape if n != -1)
            shape[shape.index(-1)] = self.size // known if known else 0
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape a shape-only array of size {self.size} into shape {tuple(shape)}")
        if self._contiguous():
            return self._view(shape, None)
        return ShapeArray(shape, self.dtype)  # NumPy copies a non-contiguous array to reshape it

    def transpose(self, *axes):
        axes = axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        axes = tuple(axes) if axes else tuple(reversed(range(self.ndim)))
        return self._view([self.shape[a] for a in axes], [self.strides[a] for a in axes])

    def swapaxes(self, a, b):
        axes = list(range(self.ndim))
        axes[a], axes[b] = axes[b], axes[a]
        return self.transpose(axes)

    def ravel(self):
        return self.reshape(-1)

    def flatten(self):
        return ShapeArray((self.size,), self.dtype)

    def squeeze(self, axis=None):
        keep = [i for i, n in enumerate(self.shape) if n != 1 or (axis is not None and i not in np.atleast_1d(axis))]
        return self._view([self.shape[i] for i in keep], [self.strides[i] for i in keep])

    def astype(self, dtype, copy=True, **_):
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        return ShapeArray(self.shape, dtype)

    def copy(self, order="C"):
        return ShapeArray(self.shape, self.dtype)

    def view(self, dtype=None):
        return self if dtype is None else ShapeArray(self.shape, dtype, None, self.offset, self.base)

    def fill(self, value):
        pass

    def __getitem__(self, index):
        return _index(self, index)

    def __setitem__(self, index, value):
        _index(self, index)  # the shapes must fit; no values to write

    # ----------------------------------------------------------------- reductions as methods
    def _reduce(self, ufunc, axis=None, dtype=None, keepdims=False, **_):
        return self.__array_ufunc__(ufunc, "reduce", self, axis=axis, dtype=dtype, keepdims=keepdims)

    def sum(self, axis=None, dtype=None, keepdims=False, **kw):
        return self._reduce(np.add, axis, dtype, keepdims)

    def prod(self, axis=None, dtype=None, keepdims=False, **kw):
        return self._reduce(np.multiply, axis, dtype, keepdims)

    def max(self, axis=None, keepdims=False, **kw):
        return self._reduce(np.maximum, axis, None, keepdims)

    def min(self, axis=None, keepdims=False, **kw):
        return self._reduce(np.minimum, axis, None, keepdims)

    def mean(self, axis=None, dtype=None, keepdims=False, **kw):
        out = self._reduce(np.add, axis, dtype, keepdims)
        return out.astype(np.result_type(out.dtype, np.float64 if out.dtype.kind in "iub" else out.dtype))

    def any(self, axis=None, keepdims=False, **kw):
        return self._reduce(np.logical_or, axis, np.bool_, keepdims)

    def all(self, axis=None, keepdims=False, **kw):
        return self._reduce(np.logical_and, axis, np.bool_, keepdims)

    def argmax(self, axis=None, **kw):
        return _argsort_like(self, axis)[0]

    # ----------------------------------------------------------------- NumPy's protocols
    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        if method == "__call__":
            shapes = [a.shape if isinstance(a, (np.ndarray, ShapeArray)) else () for a in inputs]
            shape = matmul_shape(*shapes) if ufunc is np.matmul else _broadcast(shapes)
            tokens = tuple(a.dtype if type(a) is ShapeArray else dtype_token(a) for a in inputs)
            dtypes = ufunc_dtypes(ufunc, tokens, kwargs.get("dtype"))
            results = tuple(ShapeArray(shape, d) for d in dtypes)
        elif method == "reduce":
            a = inputs[0]
            axis, keepdims = kwargs.get("axis", 0), kwargs.get("keepdims", False)
            axes = tuple(range(a.ndim)) if axis is None else tuple(x % a.ndim for x in np.atleast_1d(axis))
            shape = tuple(1 if i in axes else n for i, n in enumerate(a.shape) if keepdims or i not in axes)
            dtype = kwargs.get("dtype") or ufunc_dtypes(ufunc, (a.dtype, a.dtype), None)[0]
            if ufunc is np.add and np.dtype(dtype).kind == "b":
                dtype = np.int64
            results = (ShapeArray(shape, dtype),)
        elif method == "accumulate":
            results = (ShapeArray(inputs[0].shape, kwargs.get("dtype") or inputs[0].dtype),)
        elif method == "at":
            return None
        elif method == "outer":
            results = (ShapeArray(np.shape(inputs[0]) + np.shape(inputs[1]),
                                  ufunc_dtypes(ufunc, tuple(dtype_token(a) for a in inputs), None)[0]),)
        else:
            raise ShapeOnlyError(f"{ufunc.__name__}.{method} is not supported on shape-only arrays")
        if out is not None:
            return out[0] if len(out) == 1 else out
        return results[0] if len(results) == 1 else results

    def __array_function__(self, func, types, args, kwargs):
        handler = FUNCTIONS.get(func)
        if handler is None:
            raise ShapeOnlyError(f"np.{func.__name__} is not supported on shape-only arrays")
        return handler(*args, **kwargs)


def _broadcast(shapes):
    """``np.broadcast_shapes`` without its cost (NumPy's own where the shapes do not fit,
    for its error)."""
    out = ()
    for x in shapes:
        if x == out or not x:
            continue
        if not out:
            out = x
            continue
        long, short = (out, x) if len(out) >= len(x) else (x, out)
        merged, off = list(long), len(long) - len(short)
        for i, n in enumerate(short):
            m = long[off + i]
            if n != m and n != 1:
                if m != 1:
                    return np.broadcast_shapes(*shapes)
                merged[off + i] = n
        out = tuple(merged)
    return out


def is_shape_only(x):
    return isinstance(x, ShapeArray)


class ShapeRNG:
    """Stands in for ``np.random.default_rng()`` in a module's ``init``: its draws are
    shape-only, so ``model.init(ShapeRNG())`` gives a model's parameters without values."""

    def standard_normal(self, size=None, dtype=np.float64):
        return ShapeArray(() if size is None else np.atleast_1d(size), dtype)

    def random(self, size=None, dtype=np.float64):
        return self.standard_normal(size, dtype)


def shape_only_params(model):
    """A model's parameters as shape-only arrays (``init`` without values)."""
    return {k: v if is_shape_only(v) else ShapeArray(v.shape, v.dtype) for k, v in model.init(ShapeRNG()).items()}


def contiguous(x):
    """``np.ascontiguousarray`` for real and shape-only arrays alike."""
    if isinstance(x, ShapeArray):
        return x if x._contiguous() else x.copy()
    return np.ascontiguousarray(x)


def shape_only_like(x):
    """A ShapeArray with ``x``'s shape and dtype."""
    return ShapeArray(np.shape(x), x.dtype)


def _index(a, index):
    index = index if isinstance(index, tuple) else (index,)
    if any(isinstance(i, (np.ndarray, ShapeArray, list)) for i in index):
        return ShapeArray(advanced_shape(a.shape, index, lambda x: isinstance(x, ShapeArray)), a.dtype)
    shape, strides, offset = basic_index(a.shape, a.strides, index)
    if any(isinstance(i, (bool, np.bool_)) for i in index):  # a boolean scalar is an advanced index: a copy
        return ShapeArray(shape, a.dtype)
    return a._view(shape, strides, a.offset + offset)


def _argsort_like(a, axis=-1):
    """Balanced choices in place of data-dependent ones: along ``axis``, row i starts at i."""
    n = a.shape[axis]
    rows = np.arange(math.prod(a.shape) // n).reshape(a.shape[:axis] + a.shape[axis + 1:] if axis != -1 else
                                                       a.shape[:-1])
    order = (rows[..., None] + np.arange(n)) % n
    return order, rows
