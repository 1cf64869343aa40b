"""Intrinsics: the pieces of LLVM the host kernels need and numba lacks.

* ``blob_at(table, slot)``: an int32 array view of one blob, built from an
  address-table entry (see ``extend``) in codegen. ``numba.carray`` would do
  the same but creates a meminfo, which the kernels must not (they compile
  without numba's reference counting, ``core.NO_NRT``).
* ``as_rows(a, rows, cols)``: a 2-D view of a 1-D contiguous array.
  numba's ``reshape`` calls a C helper that searches for a no-copy layout
  at every call, and the policy's step rebuilds a dozen such views of its
  slabs (``saspec.slab``).
* ``prefetch(address)`` / ``prefetch_write(address)``: LLVM's
  ``llvm.prefetch`` of one cache line, to read or to write; never faults,
  whatever the address. The look-ahead of ``extend`` issues them.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core.imputils import impl_ret_borrowed
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array


def _prefetcher(write):
    def prefetch(typingctx, address):
        if not isinstance(address, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            try:
                ptr, name = ir.PointerType(), "llvm.prefetch.p0"  # opaque pointers (llvmlite >= 0.44)
            except TypeError:
                ptr, name = ir.IntType(8).as_pointer(), "llvm.prefetch.p0i8"
            i32 = ir.IntType(32)
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [ptr, i32, i32, i32]), name)
            builder.call(fn, [builder.inttoptr(args[0], ptr), i32(write), i32(3), i32(1)])
            return context.get_dummy_value()

        return types.void(address), codegen

    return intrinsic(prefetch)


# Hint the CPU to load the cache line at an int64 address (LLVM's
# ``llvm.prefetch``, high locality), to read it or to write it. Neither ever
# faults, whatever the address.
prefetch = _prefetcher(0)
prefetch_write = _prefetcher(1)


@njit(inline="always")
def prefetch_lines_for_write(lo, hi):
    """``prefetch_write`` every cache line of the byte range [lo, hi)."""
    a = lo - lo % 64
    while a < hi:
        prefetch_write(a)
        a += 64


@intrinsic
def blob_at(typingctx, table, slot):
    """Slot ``slot``'s blob as an int32 [table[1, slot]] array (no copy).

    ``table`` is the int64 [2, slots] C-contiguous address table. The array
    owns nothing (no meminfo), and building it in codegen rather than with
    ``numba.carray`` lets the kernels compile without numba's reference
    counting (see ``core.NO_NRT``)."""
    if not (isinstance(table, types.Array) and table.dtype == types.int64 and table.ndim == 2
            and table.layout == "C" and isinstance(slot, types.Integer)):
        return None
    blob = types.Array(types.int32, 1, "C")

    def codegen(context, builder, signature, args):
        tab = context.make_array(signature.args[0])(context, builder, args[0])
        i = context.cast(builder, args[1], signature.args[1], types.intp)
        slots = builder.extract_value(tab.shape, 1)
        address = builder.load(cgutils.gep(builder, tab.data, i))  # table[0, i]
        words = builder.load(cgutils.gep(builder, tab.data, builder.add(slots, i)))  # table[1, i]
        out = context.make_array(blob)(context, builder)
        itemsize = context.get_constant(types.intp, 4)
        populate_array(out, data=builder.inttoptr(address, context.get_value_type(types.CPointer(types.int32))),
                       shape=cgutils.pack_array(builder, [words]), strides=cgutils.pack_array(builder, [itemsize]),
                       itemsize=itemsize, meminfo=None)
        return out._getvalue()

    return blob(table, slot), codegen


@intrinsic
def as_rows(typingctx, a, rows, cols):
    """The 1-D C-contiguous array ``a`` as a C-contiguous [rows, cols] array (no copy; it shares ``a``'s
    owner). The caller sees that rows x cols == len(a); nothing here checks it."""
    if not (isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C"
            and isinstance(rows, types.Integer) and isinstance(cols, types.Integer)):
        return None
    out_t = types.Array(a.dtype, 2, "C", readonly=not a.mutable)

    def codegen(context, builder, signature, args):
        src = context.make_array(signature.args[0])(context, builder, args[0])
        r = context.cast(builder, args[1], signature.args[1], types.intp)
        c = context.cast(builder, args[2], signature.args[2], types.intp)
        out = context.make_array(out_t)(context, builder)
        itemsize = context.get_constant(types.intp, context.get_abi_sizeof(context.get_data_type(a.dtype)))
        populate_array(out, data=src.data, shape=cgutils.pack_array(builder, [r, c]),
                       strides=cgutils.pack_array(builder, [builder.mul(c, itemsize), itemsize]),
                       itemsize=itemsize, meminfo=src.meminfo, parent=src.parent)
        return impl_ret_borrowed(context, builder, out_t, out._getvalue())

    return out_t(a, rows, cols), codegen
