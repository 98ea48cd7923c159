/* CUDA versions of the NHWC window kernels: im2col, col2im, maxpool, maxpool_grad, avgpool,
   avgpool_grad (kernels/gpu.py launches them through cupy.RawModule).

   NVRTC compiles this file as it is, so it includes nothing. Each kernel computes what its
   NumPy version in kernels/conv.py or kernels/pooling.py computes, rounding the same
   operations in the same order, so the two agree bit for bit, up to the sign of a zero (and
   see maxpool_grad).

   Every kernel is a grid-stride loop over the elements of its output, any grid covering
   any size. The backward kernels are gathers: each input element adds up the
   contributions of the windows that cover it, in the order in which the NumPy version adds
   them. No two threads write one element, so there are no atomics and the result is
   deterministic.

   All kernels share one geometry: the input is (n, h, w, c), framed by pad padded rows and
   columns on each side; windows are kh x kw and move by stride; the output is (n, ho, wo, c).
   Sizes and indices are 64-bit. */

#define GEOMETRY long long n, long long h, long long w, long long c, long long kh, long long kw, \
                 long long stride, long long pad, long long ho, long long wo
#define GEOMETRY_ARGS n, h, w, c, kh, kw, stride, pad, ho, wo

#define GRID_STRIDE_LOOP(e, total)                                                       \
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < (total);   \
         e += (long long)blockDim.x * gridDim.x)

/* The smallest offset i in [0, k) at which a window covers padded coordinate p: p - i must
   be the start of one of the out windows, a multiple of stride at most (out - 1) * stride.
   The following offsets come every stride, up to min(k - 1, p). */
__device__ __forceinline__ long long first_offset(long long p, long long stride, long long out)
{
    long long last_start = (out - 1) * stride;
    return p > last_start ? p - last_start : p % stride;
}

/* Element e of an (n, rows, cols, c) tensor: its sample, row and column (plus offset, the
   padding for an input element, whose row and column then count in the padded frame), and
   channel. */
struct Position {
    long long b, row, col, ch;
};

__device__ __forceinline__ Position position(long long e, long long rows, long long cols, long long c,
                                             long long offset)
{
    Position p;
    p.ch = e % c;
    long long t = e / c;
    p.col = t % cols + offset;
    t /= cols;
    p.row = t % rows + offset;
    p.b = t / rows;
    return p;
}

/* The flat output pixel (b, oh, ow) of the window that covers input position p at window
   offset (i, j). */
__device__ __forceinline__ long long covering_pixel(Position p, long long i, long long j, long long stride,
                                                    long long ho, long long wo)
{
    return (p.b * ho + (p.row - i) / stride) * wo + (p.col - j) / stride;
}

/* Loops over the offsets (i, j) of the windows that cover input position p (its row and
   column in the padded frame), in window order: row offset i, then column offset j. */
#define FOR_EACH_COVERING_OFFSET(p, i, j)                                                   \
    for (long long i = first_offset(p.row, stride, ho); i < kh && i <= p.row; i += stride) \
        for (long long j = first_offset(p.col, stride, wo); j < kw && j <= p.col; j += stride)

/* The flat index in x (n, h, w, c) of the element at offset (i, j) of output pixel o's
   window, or -1 where that offset falls in the padding. */
__device__ __forceinline__ long long window_element(Position o, long long i, long long j, long long h,
                                                    long long w, long long c, long long stride, long long pad)
{
    long long hi = o.row * stride - pad + i, wi = o.col * stride - pad + j;
    return hi >= 0 && hi < h && wi >= 0 && wi < w ? ((o.b * h + hi) * w + wi) * c + o.ch : -1;
}

/* A product rounded on its own, as NumPy rounds it: the compiler would otherwise fuse it
   with the addition that follows into one FMA, which rounds once. */
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

/* cols (n*ho*wo, kh*kw*c), columns ordered (i, j, channel): element e copies channel ch of
   input pixel (oh*stride - pad + i, ow*stride - pad + j), or 0 in the padding. */
template <typename T>
__device__ void im2col(const T* __restrict__ x, T* __restrict__ cols, GEOMETRY)
{
    GRID_STRIDE_LOOP(e, n * ho * wo * kh * kw * c) {
        long long ch = e % c, t = e / c;
        long long j = t % kw;
        t /= kw;
        long long i = t % kh, pixel = t / kh;
        long long at = window_element(position(pixel * c + ch, ho, wo, c, 0), i, j, h, w, c, stride, pad);
        cols[e] = at >= 0 ? x[at] : (T)0;
    }
}

/* grad (n, h, w, c) from cols: each element sums the column entries that im2col copied it
   to, in window order (i, then j), starting from 0, as NumPy's per-offset += does. */
template <typename T>
__device__ void col2im(const T* __restrict__ cols, T* __restrict__ grad, GEOMETRY)
{
    GRID_STRIDE_LOOP(e, n * h * w * c) {
        Position p = position(e, h, w, c, pad);
        T sum = 0;
        FOR_EACH_COVERING_OFFSET(p, i, j) {
                long long row = covering_pixel(p, i, j, stride, ho, wo);
                sum += cols[((row * kh + i) * kw + j) * c + p.ch];
            }
        grad[e] = sum;
    }
}

/* out and argmax (n, ho, wo, c): the window maximum, padding counted as -inf, and the
   offset k = i*kw + j of its first occurrence. A NaN in the window makes the output NaN
   and keeps the argmax of the values before it, as np.maximum and > do. Padding never
   exceeds the running maximum nor is NaN, so it is skipped. */
template <typename T>
__device__ void maxpool(const T* __restrict__ x, T* __restrict__ out, unsigned char* __restrict__ argmax,
                        GEOMETRY)
{
    const T negative_infinity = -(T)__int_as_float(0x7f800000);
    GRID_STRIDE_LOOP(e, n * ho * wo * c) {
        Position o = position(e, ho, wo, c, 0);
        T best = negative_infinity;
        long long best_offset = 0;
        for (long long i = 0; i < kh; ++i)
            for (long long j = 0; j < kw; ++j) {
                long long at = window_element(o, i, j, h, w, c, stride, pad);
                if (at < 0)
                    continue;
                T value = x[at];
                if (value > best) {
                    best = value;
                    best_offset = i * kw + j;
                } else if (value != value) {
                    best = value;
                }
            }
        out[e] = best;
        argmax[e] = (unsigned char)best_offset;
    }
}

/* grad (n, h, w, c): each element sums the output gradients of the windows whose argmax is
   its offset, in window order, starting from 0. (For windows that tile the map, NumPy's
   version multiplies by a 0/1 mask instead, which spreads an infinite or NaN gradient over
   the window; this kernel routes it to the maximum alone, as NumPy's other case does.) */
template <typename T>
__device__ void maxpool_grad(const T* __restrict__ grad_out, const unsigned char* __restrict__ argmax,
                             T* __restrict__ grad, GEOMETRY)
{
    GRID_STRIDE_LOOP(e, n * h * w * c) {
        Position p = position(e, h, w, c, pad);
        T sum = 0;
        FOR_EACH_COVERING_OFFSET(p, i, j) {
                long long o = covering_pixel(p, i, j, stride, ho, wo) * c + p.ch;
                if (argmax[o] == i * kw + j)
                    sum += grad_out[o];
            }
        grad[e] = sum;
    }
}

/* out (n, ho, wo, c): the window sum times 1/(kh*kw); the padding's zeros count in the
   divisor but add nothing to the sum. */
template <typename T>
__device__ void avgpool(const T* __restrict__ x, T* __restrict__ out, GEOMETRY)
{
    const T scale = (T)(1.0 / (double)(kh * kw));
    GRID_STRIDE_LOOP(e, n * ho * wo * c) {
        Position o = position(e, ho, wo, c, 0);
        T sum = 0;
        for (long long i = 0; i < kh; ++i)
            for (long long j = 0; j < kw; ++j) {
                long long at = window_element(o, i, j, h, w, c, stride, pad);
                if (at >= 0)
                    sum += x[at];
            }
        out[e] = sum * scale;
    }
}

/* grad (n, h, w, c): each element sums grad_out * 1/(kh*kw) of the windows that cover it,
   in window order, starting from 0. */
template <typename T>
__device__ void avgpool_grad(const T* __restrict__ grad_out, T* __restrict__ grad, GEOMETRY)
{
    const T scale = (T)(1.0 / (double)(kh * kw));
    GRID_STRIDE_LOOP(e, n * h * w * c) {
        Position p = position(e, h, w, c, pad);
        T sum = 0;
        FOR_EACH_COVERING_OFFSET(p, i, j) {
                long long o = covering_pixel(p, i, j, stride, ho, wo) * c + p.ch;
                sum += mul_rn(grad_out[o], scale);
            }
        grad[e] = sum;
    }
}

/* The entry points, unmangled, one per kernel and dtype: name_f32 and name_f64. */
#define EXPORT_KERNELS(T, SUFFIX)                                                                      \
    extern "C" __global__ void im2col_##SUFFIX(const T* x, T* cols, GEOMETRY)                         \
    { im2col(x, cols, GEOMETRY_ARGS); }                                                               \
    extern "C" __global__ void col2im_##SUFFIX(const T* cols, T* grad, GEOMETRY)                      \
    { col2im(cols, grad, GEOMETRY_ARGS); }                                                            \
    extern "C" __global__ void maxpool_##SUFFIX(const T* x, T* out, unsigned char* argmax, GEOMETRY)  \
    { maxpool(x, out, argmax, GEOMETRY_ARGS); }                                                       \
    extern "C" __global__ void maxpool_grad_##SUFFIX(const T* grad_out, const unsigned char* argmax,  \
                                                     T* grad, GEOMETRY)                               \
    { maxpool_grad(grad_out, argmax, grad, GEOMETRY_ARGS); }                                          \
    extern "C" __global__ void avgpool_##SUFFIX(const T* x, T* out, GEOMETRY)                         \
    { avgpool(x, out, GEOMETRY_ARGS); }                                                               \
    extern "C" __global__ void avgpool_grad_##SUFFIX(const T* grad_out, T* grad, GEOMETRY)            \
    { avgpool_grad(grad_out, grad, GEOMETRY_ARGS); }

EXPORT_KERNELS(float, f32)
EXPORT_KERNELS(double, f64)
