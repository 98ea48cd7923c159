/* CUDA versions of the NHWC window kernels: im2col, col2im, maxpool, maxpool_grad, avgpool,
   avgpool_grad, and of the batch-norm kernels, each in one pass over memory (kernels/gpu.py
   launches them through cupy.RawModule).

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
   Sizes and indices are of the index type I: int where every array fits (gpu.py decides),
   whose division costs a fraction of a 64-bit one, else long long. */

#define GEOMETRY(I) I n, I h, I w, I c, I kh, I kw, I stride, I pad, I ho, I wo
#define GEOMETRY_ARGS n, h, w, c, kh, kw, stride, pad, ho, wo

/* Over e in [0, total), I the index type of the enclosing template. */
#define GRID_STRIDE_LOOP(e, total) \
    for (I e = blockIdx.x * (I)blockDim.x + threadIdx.x; e < (total); e += (I)blockDim.x * gridDim.x)

/* The smallest offset i in [0, k) at which a window covers padded coordinate p: p - i must
   be the start of one of the out windows, a multiple of stride at most (out - 1) * stride.
   The following offsets come every stride, up to min(k - 1, p). */
template <typename I>
__device__ __forceinline__ I first_offset(I p, I stride, I out)
{
    I last_start = (out - 1) * stride;
    return p > last_start ? p - last_start : p % stride;
}

/* Element e of an (n, rows, cols, c) tensor: its sample, row and column (plus offset, the
   padding for an input element, whose row and column then count in the padded frame), and
   channel. */
template <typename I>
struct Position {
    I b, row, col, ch;
};

template <typename I>
__device__ __forceinline__ Position<I> position(I e, I rows, I cols, I c, I offset)
{
    Position<I> p;
    p.ch = e % c;
    I t = e / c;
    p.col = t % cols + offset;
    t /= cols;
    p.row = t % rows + offset;
    p.b = t / rows;
    return p;
}

/* The flat output pixel (b, oh, ow) of the window that covers input position p at window
   offset (i, j). */
template <typename I>
__device__ __forceinline__ I covering_pixel(Position<I> p, I i, I j, I stride, I ho, I wo)
{
    return (p.b * ho + (p.row - i) / stride) * wo + (p.col - j) / stride;
}

/* Loops over the offsets (i, j) of the windows that cover input position p (its row and
   column in the padded frame), in window order: row offset i, then column offset j. */
#define FOR_EACH_COVERING_OFFSET(p, i, j)                                          \
    for (I i = first_offset(p.row, stride, ho); i < kh && i <= p.row; i += stride) \
        for (I j = first_offset(p.col, stride, wo); j < kw && j <= p.col; j += stride)

/* The flat index in x (n, h, w, c) of the element at offset (i, j) of output pixel o's
   window, or -1 where that offset falls in the padding. */
template <typename I>
__device__ __forceinline__ I window_element(Position<I> o, I i, I j, I h, I w, I c, I stride, I pad)
{
    I hi = o.row * stride - pad + i, wi = o.col * stride - pad + j;
    return hi >= 0 && hi < h && wi >= 0 && wi < w ? ((o.b * h + hi) * w + wi) * c + o.ch : -1;
}

/* A product rounded on its own, as NumPy rounds it: the compiler would otherwise fuse it
   with the addition that follows into one FMA, which rounds once. */
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

/* cols (n*ho*wo, kh*kw*c), columns ordered (i, j, channel): element e copies channel ch of
   input pixel (oh*stride - pad + i, ow*stride - pad + j), or 0 in the padding. */
template <typename T, typename I>
__device__ void im2col(const T* __restrict__ x, T* __restrict__ cols, GEOMETRY(I))
{
    GRID_STRIDE_LOOP(e, n * ho * wo * kh * kw * c) {
        I ch = e % c, t = e / c;
        I j = t % kw;
        t /= kw;
        I i = t % kh, pixel = t / kh;
        I at = window_element(position(pixel * c + ch, ho, wo, c, (I)0), i, j, h, w, c, stride, pad);
        cols[e] = at >= 0 ? x[at] : (T)0;
    }
}

/* grad (n, h, w, c) from cols: each element sums the column entries that im2col copied it
   to, in window order (i, then j), starting from 0, as NumPy's per-offset += does. */
template <typename T, typename I>
__device__ void col2im(const T* __restrict__ cols, T* __restrict__ grad, GEOMETRY(I))
{
    GRID_STRIDE_LOOP(e, n * h * w * c) {
        Position<I> p = position(e, h, w, c, pad);
        T sum = 0;
        FOR_EACH_COVERING_OFFSET(p, i, j) {
                I row = covering_pixel(p, i, j, stride, ho, wo);
                sum += cols[((row * kh + i) * kw + j) * c + p.ch];
            }
        grad[e] = sum;
    }
}

/* out and argmax (n, ho, wo, c): the window maximum, padding counted as -inf, and the
   offset k = i*kw + j of its first occurrence. A NaN in the window makes the output NaN
   and keeps the argmax of the values before it, as np.maximum and > do. Padding never
   exceeds the running maximum nor is NaN, so it is skipped. */
template <typename T, typename I>
__device__ void maxpool(const T* __restrict__ x, T* __restrict__ out, unsigned char* __restrict__ argmax,
                        GEOMETRY(I))
{
    const T negative_infinity = -(T)__int_as_float(0x7f800000);
    GRID_STRIDE_LOOP(e, n * ho * wo * c) {
        Position<I> o = position(e, ho, wo, c, (I)0);
        T best = negative_infinity;
        I best_offset = 0;
        for (I i = 0; i < kh; ++i)
            for (I j = 0; j < kw; ++j) {
                I at = window_element(o, i, j, h, w, c, stride, pad);
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
template <typename T, typename I>
__device__ void maxpool_grad(const T* __restrict__ grad_out, const unsigned char* __restrict__ argmax,
                             T* __restrict__ grad, GEOMETRY(I))
{
    GRID_STRIDE_LOOP(e, n * h * w * c) {
        Position<I> p = position(e, h, w, c, pad);
        T sum = 0;
        FOR_EACH_COVERING_OFFSET(p, i, j) {
                I o = covering_pixel(p, i, j, stride, ho, wo) * c + p.ch;
                if (argmax[o] == i * kw + j)
                    sum += grad_out[o];
            }
        grad[e] = sum;
    }
}

/* out (n, ho, wo, c): the window sum times 1/(kh*kw); the padding's zeros count in the
   divisor but add nothing to the sum. */
template <typename T, typename I>
__device__ void avgpool(const T* __restrict__ x, T* __restrict__ out, GEOMETRY(I))
{
    const T scale = (T)(1.0 / (double)(kh * kw));
    GRID_STRIDE_LOOP(e, n * ho * wo * c) {
        Position<I> o = position(e, ho, wo, c, (I)0);
        T sum = 0;
        for (I i = 0; i < kh; ++i)
            for (I j = 0; j < kw; ++j) {
                I at = window_element(o, i, j, h, w, c, stride, pad);
                if (at >= 0)
                    sum += x[at];
            }
        out[e] = sum * scale;
    }
}

/* grad (n, h, w, c): each element sums grad_out * 1/(kh*kw) of the windows that cover it,
   in window order, starting from 0. */
template <typename T, typename I>
__device__ void avgpool_grad(const T* __restrict__ grad_out, T* __restrict__ grad, GEOMETRY(I))
{
    const T scale = (T)(1.0 / (double)(kh * kw));
    GRID_STRIDE_LOOP(e, n * h * w * c) {
        Position<I> p = position(e, h, w, c, pad);
        T sum = 0;
        FOR_EACH_COVERING_OFFSET(p, i, j) {
                I o = covering_pixel(p, i, j, stride, ho, wo) * c + p.ch;
                sum += mul_rn(grad_out[o], scale);
            }
        grad[e] = sum;
    }
}

/* Batch normalisation over the channels of a (rows, c) matrix whose rows lie a stride apart
   (a channel slice of a wider NHWC map is read in place). mean, inv_std, gamma and beta are
   per channel. The element-wise kernels round each operation as the NumPy references in
   kernels/normalization.py do, in their order; the sums are taken in float64, per slot of
   rows (rows slot, slot + slots, ...: a warp reads consecutive channels of one row) into
   partial (slots, 2, c), which gpu.py adds up over the slots. */

/* x_hat = (x - mean) * inv_std, as the forward normalised. */
template <typename T>
__device__ __forceinline__ T normalized(T x, T mean, T inv_std) { return mul_rn(x - mean, inv_std); }

/* With the ReLU fused in (relu true), the upstream gradient where the layer's output
   x_hat * gamma + beta was positive and 0 elsewhere (NaN * 0 stays NaN, as in NumPy). */
template <typename T, typename I>
__device__ __forceinline__ T masked(T grad, T x_hat, T gamma, T beta, I relu)
{
    return relu ? mul_rn(grad, (T)(mul_rn(x_hat, gamma) + beta > 0)) : grad;
}

/* out (rows, c) = x_hat * gamma + beta, clamped at 0 with relu (NaN passes, as through
   np.maximum). */
template <typename T, typename I>
__device__ void batchnorm_normalize(const T* x, I x_stride, const T* mean, const T* inv_std, const T* gamma,
                                    const T* beta, T* out, I rows, I c, I relu)
{
    GRID_STRIDE_LOOP(e, rows * c) {
        I row = e / c, ch = e % c;
        T value = mul_rn(normalized(x[row * x_stride + ch], mean[ch], inv_std[ch]), gamma[ch]) + beta[ch];
        out[e] = relu && value < 0 ? (T)0 : value;
    }
}

/* partial[slot] = (sum of x - x[0], sum of (x - x[0])^2) per channel: deviations from the
   first row, the size of the spread rather than of the mean, so the sum of squares does not
   cancel when the mean is taken out (gpu.py does). */
template <typename T, typename I>
__device__ void batchnorm_sums(const T* x, I x_stride, double* partial, I rows, I c, I slots)
{
    GRID_STRIDE_LOOP(p, slots * c) {
        I slot = p / c, ch = p % c;
        double shift = (double)x[ch], sum = 0, squares = 0;
        for (I row = slot; row < rows; row += slots) {
            double deviation = (double)x[row * x_stride + ch] - shift;
            sum += deviation;
            squares += deviation * deviation;
        }
        partial[2 * slot * c + ch] = sum;
        partial[(2 * slot + 1) * c + ch] = squares;
    }
}

/* partial[slot] = (sum of g, sum of g * x_hat) per channel, g the (masked) upstream gradient. */
template <typename T, typename I>
__device__ void batchnorm_grad_sums(const T* grad, I grad_stride, const T* x, I x_stride, const T* mean,
                                    const T* inv_std, const T* gamma, const T* beta, double* partial, I rows, I c,
                                    I slots, I relu)
{
    GRID_STRIDE_LOOP(p, slots * c) {
        I slot = p / c, ch = p % c;
        double sum = 0, product = 0;
        for (I row = slot; row < rows; row += slots) {
            T x_hat = normalized(x[row * x_stride + ch], mean[ch], inv_std[ch]);
            T g = masked(grad[row * grad_stride + ch], x_hat, gamma[ch], beta[ch], relu);
            sum += g;
            product += (double)g * (double)x_hat;
        }
        partial[2 * slot * c + ch] = sum;
        partial[(2 * slot + 1) * c + ch] = product;
    }
}

/* out (rows, c) = scale * (g - mean_grad - x_hat * mean_grad_hat), plus addend where
   has_addend (the input's gradient from its other consumers), g masked as above. */
template <typename T, typename I>
__device__ void batchnorm_grad_input(const T* grad, I grad_stride, const T* x, I x_stride, const T* mean,
                                     const T* inv_std, const T* gamma, const T* beta, const T* scale,
                                     const T* mean_grad, const T* mean_grad_hat, const T* addend, I addend_stride,
                                     T* out, I rows, I c, I relu, I has_addend)
{
    GRID_STRIDE_LOOP(e, rows * c) {
        I row = e / c, ch = e % c;
        T x_hat = normalized(x[row * x_stride + ch], mean[ch], inv_std[ch]);
        T g = masked(grad[row * grad_stride + ch], x_hat, gamma[ch], beta[ch], relu);
        T value = mul_rn(scale[ch], g - mean_grad[ch] - mul_rn(x_hat, mean_grad_hat[ch]));
        out[e] = has_addend ? value + addend[row * addend_stride + ch] : value;
    }
}

#define PER_CHANNEL(T) const T *mean, const T *inv_std, const T *gamma, const T *beta
#define PER_CHANNEL_ARGS mean, inv_std, gamma, beta

/* The entry points, unmangled, one per kernel, dtype and index
   type: name_f32_i32 and so on. */
#define EXPORT_KERNELS(T, I, SUFFIX)                                                                          \
    extern "C" __global__ void im2col_##SUFFIX(const T* x, T* cols, GEOMETRY(I))                              \
    { im2col(x, cols, GEOMETRY_ARGS); }                                                                       \
    extern "C" __global__ void col2im_##SUFFIX(const T* cols, T* grad, GEOMETRY(I))                           \
    { col2im(cols, grad, GEOMETRY_ARGS); }                                                                    \
    extern "C" __global__ void maxpool_##SUFFIX(const T* x, T* out, unsigned char* argmax, GEOMETRY(I))       \
    { maxpool(x, out, argmax, GEOMETRY_ARGS); }                                                               \
    extern "C" __global__ void maxpool_grad_##SUFFIX(const T* grad_out, const unsigned char* argmax,          \
                                                     T* grad, GEOMETRY(I))                                    \
    { maxpool_grad(grad_out, argmax, grad, GEOMETRY_ARGS); }                                                  \
    extern "C" __global__ void avgpool_##SUFFIX(const T* x, T* out, GEOMETRY(I))                              \
    { avgpool(x, out, GEOMETRY_ARGS); }                                                                       \
    extern "C" __global__ void avgpool_grad_##SUFFIX(const T* grad_out, T* grad, GEOMETRY(I))                 \
    { avgpool_grad(grad_out, grad, GEOMETRY_ARGS); }                                                          \
    extern "C" __global__ void batchnorm_normalize_##SUFFIX(const T* x, I x_stride, PER_CHANNEL(T),           \
                                                            T* out, I rows, I c,                              \
                                                            I relu)                                           \
    { batchnorm_normalize(x, x_stride, PER_CHANNEL_ARGS, out, rows, c, relu); }                               \
    extern "C" __global__ void batchnorm_sums_##SUFFIX(const T* x, I x_stride, double* partial,               \
                                                       I rows, I c, I slots)                                  \
    { batchnorm_sums(x, x_stride, partial, rows, c, slots); }                                                 \
    extern "C" __global__ void batchnorm_grad_sums_##SUFFIX(const T* grad, I grad_stride,                     \
                                                            const T* x, I x_stride,                           \
                                                            PER_CHANNEL(T), double* partial,                  \
                                                            I rows, I c,                                      \
                                                            I slots, I relu)                                  \
    { batchnorm_grad_sums(grad, grad_stride, x, x_stride, PER_CHANNEL_ARGS, partial, rows, c, slots, relu); } \
    extern "C" __global__ void batchnorm_grad_input_##SUFFIX(                                                 \
        const T* grad, I grad_stride, const T* x, I x_stride, PER_CHANNEL(T),                                 \
        const T* scale, const T* mean_grad, const T* mean_grad_hat, const T* addend,                          \
        I addend_stride, T* out, I rows, I c, I relu,                                                         \
        I has_addend)                                                                                         \
    { batchnorm_grad_input(grad, grad_stride, x, x_stride, PER_CHANNEL_ARGS, scale, mean_grad,                \
                           mean_grad_hat, addend, addend_stride, out, rows, c, relu, has_addend); }

EXPORT_KERNELS(float, int, f32_i32)
EXPORT_KERNELS(float, long long, f32_i64)
EXPORT_KERNELS(double, int, f64_i32)
EXPORT_KERNELS(double, long long, f64_i64)
