"""Non-temporal ("streaming") stores for decodes whose output does not fit in cache.

Why: a decode that writes a fresh 100 MB float32 array is bound by memory traffic, and
a plain store first reads each destination cache line into the cache (read-for-
ownership) before overwriting all of it. For fp16/bf16 -> fp32 that is 2 bytes read +
4 bytes read-for-ownership + 4 bytes written per element; a streaming store skips the
read-for-ownership (x86 ``MOVNTPS``/``VMOVNTPS``, AArch64 ``STNP``), 6 bytes instead
of 10, and does not evict the rest of the cache. torch's ``copy_`` (the fp16/bf16
decode it offers) uses plain stores; this is how geomx's decodes get ahead of it.

How: LLVM marks a store non-temporal with ``!nontemporal`` metadata; numba has no
spelling for it, so the widening conversions are tiny intrinsics that emit the whole
vector loop: load 16 half-width values, widen them to float32 (bf16: shift into the
top half; fp16: LLVM's ``fpext``, the CPU's conversion instruction, with the same NaN
fix-up as ``cpu_kernels._f16_to_f32_hw``), and store them with that metadata. Results
are bit-identical to the plain kernels (tested).

Streaming only pays when the output is larger than the cache: below
:data:`STREAM_MIN_ELEMENTS` the kernels use plain stores, so a decoded tensor that is
read again right away (aggregated, applied) stays in cache. Intel's optimisation manual
(section "Non-temporal stores") and Drepper, "What every programmer should know about
memory" (6.1) describe the trade-off.
"""
from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

#: Outputs with at least this many float32 elements (32 MiB, this machine's L3) use
#: streaming stores; smaller ones are left in cache for whoever reads them next.
STREAM_MIN_ELEMENTS = 1 << 23
#: Bytes per vector store; the destination of each streamed run is aligned to it.
VECTOR_BYTES = 32
#: Elements per loop iteration (two 32-byte stores); a streamed run is a multiple of it.
LANES = 16


def _u32_splat(value: int) -> ir.Constant:
    return ir.Constant(ir.VectorType(ir.IntType(32), LANES), [ir.IntType(32)(value)] * LANES)


def _widen_bf16(builder: ir.IRBuilder, h: ir.Value, quiet_nan: ir.Value | None) -> ir.Value:
    """<16 x i16> bfloat16 bits -> <16 x float>: the bits become the top half."""
    wide = builder.zext(h, ir.VectorType(ir.IntType(32), LANES))
    return builder.bitcast(builder.shl(wide, _u32_splat(16)), ir.VectorType(ir.FloatType(), LANES))


def _widen_f16(builder: ir.IRBuilder, h: ir.Value, quiet_nan: ir.Value | None) -> ir.Value:
    """<16 x i16> fp16 bits -> <16 x float> with ``fpext``; unless ``quiet_nan``, a
    signalling NaN's quiet bit (fp32 bit 22, which the hardware sets) is cleared again,
    as numpy's cast keeps it signalling (see ``cpu_kernels._f16_to_f32_hw``)."""
    i32v = ir.VectorType(ir.IntType(32), LANES)
    f32v = ir.VectorType(ir.FloatType(), LANES)
    f = builder.fpext(builder.bitcast(h, ir.VectorType(ir.HalfType(), LANES)), f32v)
    w = builder.zext(h, i32v)
    is_nan_exp = builder.icmp_unsigned("==", builder.and_(w, _u32_splat(0x7E00)), _u32_splat(0x7C00))
    has_payload = builder.icmp_unsigned("!=", builder.and_(w, _u32_splat(0x1FF)), _u32_splat(0))
    snan = builder.zext(builder.and_(is_nan_exp, has_payload), i32v)
    keep = builder.select(quiet_nan, _u32_splat(0), _u32_splat(1 << 22))  # bits to clear
    clear = builder.and_(builder.shl(snan, _u32_splat(22)), keep)
    bits = builder.and_(builder.bitcast(f, i32v), builder.not_(clear))
    return builder.bitcast(bits, f32v)


def _stream_loop(context, builder, signature, args, widen) -> ir.Value:
    """``out[lo:lo+n] = widen(src[lo:lo+n])`` with non-temporal stores."""
    o = context.make_array(signature.args[0])(context, builder, args[0])
    s = context.make_array(signature.args[1])(context, builder, args[1])
    lo, n = args[2], args[3]
    quiet = args[4] if len(args) > 4 else None
    u16v = ir.VectorType(ir.IntType(16), LANES)
    f32v = ir.VectorType(ir.FloatType(), LANES)
    nontemporal = builder.module.add_metadata([ir.IntType(32)(1)])
    src0 = builder.gep(s.data, [lo])
    dst0 = builder.gep(o.data, [lo])
    step = ir.Constant(n.type, LANES)
    with cgutils.for_range_slice(builder, ir.Constant(n.type, 0), n, step) as (i, _):
        h = builder.load(builder.bitcast(builder.gep(src0, [i]), u16v.as_pointer()), align=2)
        st = builder.store(widen(builder, h, quiet), builder.bitcast(builder.gep(dst0, [i]), f32v.as_pointer()),
                           align=VECTOR_BYTES)
        st.set_metadata("nontemporal", nontemporal)
    return context.get_dummy_value()


_F32 = types.Array(types.float32, 1, "C")
_U16 = (types.Array(types.uint16, 1, "C"), types.Array(types.uint16, 1, "A"))


@intrinsic
def stream_bf16_to_f32(typingctx, out, src, lo, n):
    """``out[lo:lo+n]`` <- the bfloat16 bits ``src[lo:lo+n]`` as float32, streamed.

    Preconditions (the kernels in ``cpu_kernels`` establish them; nothing is checked
    here): ``n`` is a multiple of :data:`LANES` and ``out``'s address at ``lo`` is a
    multiple of :data:`VECTOR_BYTES`."""
    if out != _F32 or src not in _U16:
        return None
    return types.void(out, src, types.intp, types.intp), lambda c, b, sig, a: _stream_loop(c, b, sig, a, _widen_bf16)


@intrinsic
def stream_f16_to_f32(typingctx, out, src, lo, n, quiet_nan):
    """``out[lo:lo+n]`` <- the fp16 bits ``src[lo:lo+n]`` as float32, streamed (F16C
    CPUs only: elsewhere LLVM would need a library call numba cannot link). Same
    preconditions as :func:`stream_bf16_to_f32`."""
    if out != _F32 or src not in _U16:
        return None
    sig = types.void(out, src, types.intp, types.intp, types.boolean)
    return sig, lambda c, b, sg, a: _stream_loop(c, b, sg, a, _widen_f16)


@intrinsic
def store_fence(typingctx):
    """A full fence: streaming stores are weakly ordered, so a thread fences once after
    its last one, before the data is handed to anyone else (``MFENCE`` on x86)."""

    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen


@njit(cache=True, inline="always")
def head_elements(addr: int, lo: int, hi: int) -> int:
    """How many float32 elements from ``lo`` come before the first vector-aligned one
    (``addr`` is the array's base address, a multiple of 4), at most ``hi - lo``."""
    off = (addr + 4 * lo) % VECTOR_BYTES
    h = ((VECTOR_BYTES - off) % VECTOR_BYTES) // 4
    return min(h, hi - lo)
