// ccl_kernel_body.h - the device part of the kernels (element types and loops, the LL
// protocol, the lane scheduler with its counters and wait slots, the plan kernel), shared
// by two compilations:
// * ccl_kernels.cu (nvcc / hipcc through ccl_portability.h): the real device code;
// * host_kernel.cpp (the system C++ compiler through ccl_host_sim.h): the same source run
//   on the CPU, one OS thread per CUDA thread, for the emulated device and the tests.
// Include it after ccl_device.h and a portability header (one of the two above). The
// memory accesses other agents observe go through ccl_ld64 / ccl_st64 / ccl_ld32: volatile
// accesses on the device, acquire/release atomics on the host (what ThreadSanitizer and
// the C++ memory model need to see the same protocol).

#ifndef CCL_KERNEL_BODY_H
#define CCL_KERNEL_BODY_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

// Threads per block; tests' host builds use fewer (build.rs passes -DCCL_THREADS=n).
#ifndef CCL_THREADS
#define CCL_THREADS 512
#endif

#ifndef CCL_HOST_SIM
#define CCL_HOST_SIM 0
#endif

// The abort flag is polled every CCL_ABORT_POLL_MASK + 1 idle passes (or LL spins). A
// GPU pass takes ~100 ns; a pass of the host build wakes the block's threads through a
// barrier (microseconds, more on a loaded machine), so it polls more often.
#ifndef CCL_ABORT_POLL_MASK
#if CCL_HOST_SIM
#define CCL_ABORT_POLL_MASK 15u
#else
#define CCL_ABORT_POLL_MASK 1023u
#endif
#endif

#if CCL_HOST_SIM
// Block-shared state: one object per block, allocated by the host launcher.
#define CCL_BLOCK_SHARED(T, name) T &name = *static_cast<T *>(ccl_sim::block_shared())
#define CCL_SPIN_PAUSE() ccl_sim::spin_pause()
#else
#define CCL_BLOCK_SHARED(T, name) __shared__ T name
#define CCL_SPIN_PAUSE() \
  do {                   \
  } while (0)
#endif

// ---------------------------------------------------------------------------------------
// Element types
// ---------------------------------------------------------------------------------------

namespace {

// Bit-exact conversions, identical to ccl-core/src/reduce/convert.rs (used by the HIP
// build for bf16/fp8, and by both builds as the reference on the host side).
__host__ __device__ inline float bits_f32(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}
__host__ __device__ inline uint32_t f32_bits(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return b;
}
#if CCL_PLATFORM_HIP
__host__ __device__ inline uint32_t subnormal_code(uint32_t abs, uint32_t magic) {
  return f32_bits(bits_f32(abs) + bits_f32(magic)) - magic;
}
__host__ __device__ inline uint16_t sw_f32_to_bf16(float x) {
  uint32_t bits = f32_bits(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFF;
  uint32_t lsb = (bits >> 16) & 1u;
  return (uint16_t)((bits + 0x7FFFu + lsb) >> 16);
}
template <uint32_t MBITS, uint32_t BIAS>
__host__ __device__ inline uint8_t sw_f32_to_fp8(float x, uint32_t max_bits, uint32_t max_code) {
  uint32_t bits = f32_bits(x);
  uint32_t sign = (bits >> 24) & 0x80u;
  uint32_t abs = bits & 0x7FFFFFFFu;
  const uint32_t shift = 23 - MBITS;
  uint32_t odd = (abs >> shift) & 1u;
  uint32_t normal = (abs - ((127u - BIAS) << 23) + ((1u << (shift - 1)) - 1u + odd)) >> shift;
  uint32_t sub = subnormal_code(abs, (151u - BIAS - MBITS) << 23);
  uint32_t r = abs < ((127u + 1u - BIAS) << 23) ? sub : normal;
  if (abs > max_bits) r = max_code;
  if (abs > 0x7F800000u) return 0x7F;
  return (uint8_t)(r | sign);
}
#endif  // CCL_PLATFORM_HIP (encoders)
__host__ __device__ inline float sw_bf16_to_f32(uint16_t b) { return bits_f32((uint32_t)b << 16); }
__host__ __device__ inline float sw_f16_to_f32(uint16_t b) {
  uint32_t x = b;
  uint32_t sign = (x & 0x8000u) << 16;
  uint32_t em = x & 0x7FFFu;
  uint32_t r;
  if (em >= 0x7C00u) r = (em << 13) | 0x7F800000u;
  else if (em < 0x0400u) r = f32_bits(bits_f32(0x3F000000u + em) - 0.5f);
  else r = (em << 13) + 0x38000000u;
  return bits_f32(r | sign);
}
__host__ __device__ inline float sw_e4m3_to_f32(uint8_t b) {
  uint32_t x = b;
  uint32_t sign = (x & 0x80u) << 24;
  uint32_t em = x & 0x7Fu;
  uint32_t r;
  if (em == 0x7Fu) r = 0x7FC00000u;
  else if (em < 0x08u) r = f32_bits(bits_f32(0x46800000u + em) - 16384.0f);
  else r = (em << 20) + ((127u - 7u) << 23);
  return bits_f32(r | sign);
}
__host__ __device__ inline float sw_e5m2_to_f32(uint8_t b) { return sw_f16_to_f32((uint16_t)((uint16_t)b << 8)); }

// Integer kinds: arithmetic in the unsigned type of the same width (wrapping).
template <typename S, typename U>
struct IntKind {
  typedef S Store;
  typedef S A;
  static __host__ __device__ inline A load(Store s) { return s; }
  static __host__ __device__ inline Store store(A a) { return a; }
  static __host__ __device__ inline A round(A a) { return a; }
  static __host__ __device__ inline A add(A a, A b) { return (A)(U)((U)a + (U)b); }
  static __host__ __device__ inline A mul(A a, A b) { return (A)(U)((U)a * (U)b); }
  static __host__ __device__ inline A max(A a, A b) { return a > b ? a : b; }
  static __host__ __device__ inline A min(A a, A b) { return a < b ? a : b; }
  // Integer Avg: truncating division in 64 bits (n may not fit the element type).
  static __host__ __device__ inline A div(A a, uint32_t n) {
    if ((S)-1 < (S)0) return (A)((int64_t)a / (int64_t)n);
    return (A)((uint64_t)a / (uint64_t)n);
  }
};

// Wide enough unsigned type for 8/32/64-bit integer multiplication without promotion to
// signed int (uint8 * uint8 would promote to int; the result is truncated anyway).
typedef IntKind<int8_t, uint32_t> KI8;
typedef IntKind<uint8_t, uint32_t> KU8;
typedef IntKind<int32_t, uint32_t> KI32;
typedef IntKind<uint32_t, uint32_t> KU32;
typedef IntKind<int64_t, uint64_t> KI64;
typedef IntKind<uint64_t, uint64_t> KU64;

// Max/Min of floats as the host backend's Reducer answers them (ccl-core reduce::kinds):
// fmax/fmin (a NaN operand is ignored when the other is a number), except that of two
// equal operands, which differ in bits only for +0 and -0, Max answers +0 and Min -0
// (IEEE 754-2019 maximum/minimum order; fmax/fmin leave that pair open: the CPU builds of
// this file answered -0 for Max). Bitwise AND/OR of the two encodings picks that zero and
// leaves equal nonzero values unchanged.
template <typename T> struct FloatBits;
template <> struct FloatBits<float> { typedef uint32_t U; };
template <> struct FloatBits<double> { typedef uint64_t U; };

template <typename T>
__host__ __device__ inline T zero_signed(T a, T b, bool want_max) {
  typename FloatBits<T>::U x, y, r;
  memcpy(&x, &a, sizeof x);
  memcpy(&y, &b, sizeof y);
  r = want_max ? (x & y) : (x | y);
  T out;
  memcpy(&out, &r, sizeof out);
  return out;
}
__host__ __device__ inline float float_max(float a, float b) {
  return a == b ? zero_signed(a, b, true) : fmaxf(a, b);
}
__host__ __device__ inline float float_min(float a, float b) {
  return a == b ? zero_signed(a, b, false) : fminf(a, b);
}
__host__ __device__ inline double float_max(double a, double b) {
  return a == b ? zero_signed(a, b, true) : fmax(a, b);
}
__host__ __device__ inline double float_min(double a, double b) {
  return a == b ? zero_signed(a, b, false) : fmin(a, b);
}

template <typename T>
struct NativeFloatKind {
  typedef T Store;
  typedef T A;
  static __host__ __device__ inline A load(Store s) { return s; }
  static __host__ __device__ inline Store store(A a) { return a; }
  static __host__ __device__ inline A round(A a) { return a; }
  static __host__ __device__ inline A add(A a, A b) { return a + b; }
  static __host__ __device__ inline A mul(A a, A b) { return a * b; }
  static __host__ __device__ inline A max(A a, A b) { return float_max(a, b); }
  static __host__ __device__ inline A min(A a, A b) { return float_min(a, b); }
  static __host__ __device__ inline A div(A a, uint32_t) { return a; }
};
typedef NativeFloatKind<float> KF32;
typedef NativeFloatKind<double> KF64;

// Small floats: stored as bits, computed in float, rounded once per operation.
template <typename S, typename Conv>
struct SmallFloatKind {
  typedef S Store;
  typedef float A;
  static __host__ __device__ inline A load(Store s) { return Conv::to_f32(s); }
  static __host__ __device__ inline Store store(A a) { return Conv::from_f32(a); }
  static __host__ __device__ inline A round(A a) { return load(store(a)); }
  static __host__ __device__ inline A add(A a, A b) { return a + b; }
  static __host__ __device__ inline A mul(A a, A b) { return a * b; }
  static __host__ __device__ inline A max(A a, A b) { return float_max(a, b); }
  static __host__ __device__ inline A min(A a, A b) { return float_min(a, b); }
  static __host__ __device__ inline A div(A a, uint32_t) { return a; }
};

struct ConvF16 {
  static __host__ __device__ inline float to_f32(uint16_t b) {
#if CCL_PLATFORM_HIP
    return sw_f16_to_f32(b);
#else
    __half_raw r;
    r.x = b;
    return __half2float(__half(r));
#endif
  }
  static __host__ __device__ inline uint16_t from_f32(float f) {
    // Round to nearest even; NaN -> 0x7FFF (canonical, as cvt.rn.f16.f32).
    if (f != f) return 0x7FFF;
    __half h = __float2half_rn(f);
    __half_raw r = h;
    return r.x;
  }
};
struct ConvBF16 {
  static __host__ __device__ inline float to_f32(uint16_t b) { return sw_bf16_to_f32(b); }
  static __host__ __device__ inline uint16_t from_f32(float f) {
#if CCL_PLATFORM_HIP
    return sw_f32_to_bf16(f);
#else
    if (f != f) return 0x7FFF;
    __nv_bfloat16 h = __float2bfloat16_rn(f);
    __nv_bfloat16_raw r = h;
    return r.x;
#endif
  }
};
struct ConvE4M3 {
  static __host__ __device__ inline float to_f32(uint8_t b) { return sw_e4m3_to_f32(b); }
  static __host__ __device__ inline uint8_t from_f32(float f) {
#if CCL_PLATFORM_HIP
    return sw_f32_to_fp8<3, 7>(f, 0x43E00000u, 0x7Eu);
#else
    if (f != f) return 0x7F;
    return (uint8_t)__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
#endif
  }
};
struct ConvE5M2 {
  static __host__ __device__ inline float to_f32(uint8_t b) { return sw_e5m2_to_f32(b); }
  static __host__ __device__ inline uint8_t from_f32(float f) {
#if CCL_PLATFORM_HIP
    return sw_f32_to_fp8<2, 15>(f, 0x47600000u, 0x7Bu);
#else
    if (f != f) return 0x7F;
    return (uint8_t)__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E5M2);
#endif
  }
};
typedef SmallFloatKind<uint16_t, ConvF16> KF16;
typedef SmallFloatKind<uint16_t, ConvBF16> KBF16;
typedef SmallFloatKind<uint8_t, ConvE4M3> KE4M3;
typedef SmallFloatKind<uint8_t, ConvE5M2> KE5M2;

// ---------------------------------------------------------------------------------------
// Element loops (whole block, grid-stride over the block's threads)
// ---------------------------------------------------------------------------------------

struct RedCtx {
  uint32_t op;
  uint32_t avg_divisor;
  uint64_t scalar_bits;
};

template <typename K>
__host__ __device__ inline typename K::A scalar_of(const RedCtx &c) {
  typename K::Store s;
  memcpy(&s, &c.scalar_bits, sizeof(s));
  return K::load(s);
}

template <typename K>
__host__ __device__ inline typename K::A pre(const RedCtx &c, typename K::A x, typename K::A s) {
  // PreMulSum: x * s rounded to the type; other ops: x.
  return c.op == CCL_OP_PREMUL ? K::round(K::mul(x, s)) : x;
}

template <typename K>
__host__ __device__ inline typename K::A combine(const RedCtx &c, typename K::A in, typename K::A local,
                                        typename K::A s) {
  switch (c.op) {
    case CCL_OP_PROD: return K::mul(in, local);
    case CCL_OP_MAX: return K::max(in, local);
    case CCL_OP_MIN: return K::min(in, local);
    case CCL_OP_PREMUL: return K::add(in, K::round(K::mul(local, s)));
    default: return K::add(in, local);
  }
}

template <typename K>
__host__ __device__ inline typename K::A finish(const RedCtx &c, typename K::A v) {
  return c.avg_divisor ? K::div(v, c.avg_divisor) : v;
}

// One element: finish?(in OP pre(local)), or finish?(pre(local)) when in == NULL. Shared by
// the kernels and the host-callable ccl_dev_host_elem (tested against ccl-core's Reducer).
template <typename K>
__host__ __device__ inline typename K::Store elem(const RedCtx &c, const typename K::Store *in,
                                                  typename K::Store local, typename K::A s,
                                                  bool do_finish) {
  // Without a pre-multiplication the first contribution enters unchanged (bits copied, as
  // Reducer::load does: no saturation of fp8 infinities, NaN payloads kept).
  if (!in && c.op != CCL_OP_PREMUL && !(do_finish && c.avg_divisor)) return local;
  typename K::A v = in ? combine<K>(c, K::load(*in), K::load(local), s) : pre<K>(c, K::load(local), s);
  if (do_finish) v = finish<K>(c, v);
  return K::store(v);
}

template <typename K>
void host_elem(const RedCtx &c, int32_t has_in, uint64_t in_bits, uint64_t local_bits,
               int32_t do_finish, uint64_t *out) {
  typedef typename K::Store S;
  S in, local;
  memcpy(&in, &in_bits, sizeof(S));
  memcpy(&local, &local_bits, sizeof(S));
  S r = elem<K>(c, has_in ? &in : NULL, local, scalar_of<K>(c), do_finish != 0);
  uint64_t o = 0;
  memcpy(&o, &r, sizeof(S));
  *out = o;
}

// host_elem for a runtime dtype; false for bad arguments.
inline bool host_elem_any(uint32_t dtype, uint32_t op, uint32_t avg_divisor, uint64_t scalar_bits,
                          int32_t has_in, uint64_t in_bits, uint64_t local_bits, int32_t do_finish,
                          uint64_t *out) {
  if (!out || dtype >= CCL_DT_COUNT || op > CCL_OP_PREMUL) return false;
  RedCtx c;
  c.op = op;
  c.avg_divisor = avg_divisor;
  c.scalar_bits = scalar_bits;
  switch (dtype) {
    case CCL_DT_INT8: host_elem<KI8>(c, has_in, in_bits, local_bits, do_finish, out); break;
    case CCL_DT_UINT8: host_elem<KU8>(c, has_in, in_bits, local_bits, do_finish, out); break;
    case CCL_DT_INT32: host_elem<KI32>(c, has_in, in_bits, local_bits, do_finish, out); break;
    case CCL_DT_UINT32: host_elem<KU32>(c, has_in, in_bits, local_bits, do_finish, out); break;
    case CCL_DT_INT64: host_elem<KI64>(c, has_in, in_bits, local_bits, do_finish, out); break;
    case CCL_DT_UINT64: host_elem<KU64>(c, has_in, in_bits, local_bits, do_finish, out); break;
    case CCL_DT_FLOAT16: host_elem<KF16>(c, has_in, in_bits, local_bits, do_finish, out); break;
    case CCL_DT_FLOAT32: host_elem<KF32>(c, has_in, in_bits, local_bits, do_finish, out); break;
    case CCL_DT_FLOAT64: host_elem<KF64>(c, has_in, in_bits, local_bits, do_finish, out); break;
    case CCL_DT_BFLOAT16: host_elem<KBF16>(c, has_in, in_bits, local_bits, do_finish, out); break;
    case CCL_DT_FLOAT8E4M3: host_elem<KE4M3>(c, has_in, in_bits, local_bits, do_finish, out); break;
    default: host_elem<KE5M2>(c, has_in, in_bits, local_bits, do_finish, out); break;
  }
  return true;
}

// Why the launcher refuses a plan (checked on the host before a launch), or NULL.
inline const char *plan_error(const ccl_dev_plan_t &p) {
  if (p.n_channels == 0 || p.n_channels > CCL_MAX_CHANNELS)
    return "ccl_dev_launch_plan: n_channels out of 1..=32";
  if (p.unit == 0 || p.unit > 8) return "ccl_dev_launch_plan: unit out of 1..=8";
  if (p.reduce && (p.dtype >= CCL_DT_COUNT || p.op > CCL_OP_PREMUL))
    return "ccl_dev_launch_plan: bad dtype or op";
  static const uint32_t kSize[CCL_DT_COUNT] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  if (p.reduce && p.unit != kSize[p.dtype])
    return "ccl_dev_launch_plan: unit differs from the element size of dtype";
  if ((p.n_lanes && (!p.lanes || !p.steps || !p.conns)) || (p.n_locals && !p.locals))
    return "ccl_dev_launch_plan: missing arrays";
  if (p.proto != CCL_PROTO_SIMPLE && p.proto != CCL_PROTO_LL)
    return "ccl_dev_launch_plan: protocol is neither Simple nor LL";
  if (p.stall_channel != CCL_STALL_NONE && p.stall_channel != CCL_STALL_ALL &&
      p.stall_channel >= p.n_channels)
    return "ccl_dev_launch_plan: stall_channel is not a channel of the plan";
  return NULL;
}

// out/dst = finish?(in OP pre(src)) or pre(src) when in == NULL; either output may be NULL.
template <typename K>
__device__ void reduce_block(const RedCtx &c, const void *in_, const void *src_, void *out_,
                             void *dst_, uint64_t n, bool do_finish) {
  typedef typename K::Store S;
  const S *in = (const S *)in_;
  const S *src = (const S *)src_;
  S *out = (S *)out_;
  S *dst = (S *)dst_;
  typename K::A s = scalar_of<K>(c);
  for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) {
    S r = elem<K>(c, in ? &in[i] : NULL, src[i], s, do_finish);
    if (out) out[i] = r;
    if (dst) dst[i] = r;
  }
}

__device__ void copy_block(const void *src, void *out, void *dst, uint64_t nb) {
  uintptr_t a = (uintptr_t)src | (uintptr_t)out | (uintptr_t)dst | (uintptr_t)nb;
  if ((a & 15u) == 0) {
    const uint4 *s = (const uint4 *)src;
    uint4 *o = (uint4 *)out;
    uint4 *d = (uint4 *)dst;
    for (uint64_t i = threadIdx.x; i < nb / 16; i += blockDim.x) {
      uint4 v = s[i];
      if (o) o[i] = v;
      if (d) d[i] = v;
    }
  } else {
    const uint8_t *s = (const uint8_t *)src;
    uint8_t *o = (uint8_t *)out;
    uint8_t *d = (uint8_t *)dst;
    for (uint64_t i = threadIdx.x; i < nb; i += blockDim.x) {
      uint8_t v = s[i];
      if (o) o[i] = v;
      if (d) d[i] = v;
    }
  }
}

template <typename K>
__device__ void run_step_typed(const ccl_dev_plan_t &p, const RedCtx &c, uint32_t kind,
                               const void *in, const void *src, void *out, void *dst,
                               uint64_t n) {
  uint64_t nb = n * p.unit;
  switch (kind) {
    case CCL_STEP_SEND:
      if (p.reduce && c.op == CCL_OP_PREMUL) reduce_block<K>(c, NULL, src, out, NULL, n, false);
      else copy_block(src, out, NULL, nb);
      break;
    case CCL_STEP_RECV: copy_block(in, NULL, dst, nb); break;
    case CCL_STEP_RECV_COPY_SEND: copy_block(in, out, dst, nb); break;
    case CCL_STEP_RECV_REDUCE_SEND: reduce_block<K>(c, in, src, out, NULL, n, false); break;
    case CCL_STEP_RECV_REDUCE_COPY_SEND: reduce_block<K>(c, in, src, out, dst, n, true); break;
    case CCL_STEP_RECV_REDUCE_COPY: reduce_block<K>(c, in, src, NULL, dst, n, true); break;
    default: break;
  }
}

__device__ void run_step(const ccl_dev_plan_t &p, const RedCtx &c, uint32_t kind, const void *in,
                         const void *src, void *out, void *dst, uint64_t n) {
  // Pure data movement needs no element type (non-reducing plans may carry any dtype).
  uint64_t nb = n * p.unit;
  if (kind == CCL_STEP_RECV) return copy_block(in, NULL, dst, nb);
  if (kind == CCL_STEP_RECV_COPY_SEND) return copy_block(in, out, dst, nb);
  if (kind == CCL_STEP_SEND && !(p.reduce && c.op == CCL_OP_PREMUL)) return copy_block(src, out, NULL, nb);
  if (!p.reduce) return;  // reducing steps in a non-reducing plan: rejected by the host
  switch (p.dtype) {
    case CCL_DT_INT8: run_step_typed<KI8>(p, c, kind, in, src, out, dst, n); break;
    case CCL_DT_UINT8: run_step_typed<KU8>(p, c, kind, in, src, out, dst, n); break;
    case CCL_DT_INT32: run_step_typed<KI32>(p, c, kind, in, src, out, dst, n); break;
    case CCL_DT_UINT32: run_step_typed<KU32>(p, c, kind, in, src, out, dst, n); break;
    case CCL_DT_INT64: run_step_typed<KI64>(p, c, kind, in, src, out, dst, n); break;
    case CCL_DT_UINT64: run_step_typed<KU64>(p, c, kind, in, src, out, dst, n); break;
    case CCL_DT_FLOAT16: run_step_typed<KF16>(p, c, kind, in, src, out, dst, n); break;
    case CCL_DT_FLOAT32: run_step_typed<KF32>(p, c, kind, in, src, out, dst, n); break;
    case CCL_DT_FLOAT64: run_step_typed<KF64>(p, c, kind, in, src, out, dst, n); break;
    case CCL_DT_BFLOAT16: run_step_typed<KBF16>(p, c, kind, in, src, out, dst, n); break;
    case CCL_DT_FLOAT8E4M3: run_step_typed<KE4M3>(p, c, kind, in, src, out, dst, n); break;
    case CCL_DT_FLOAT8E5M2: run_step_typed<KE5M2>(p, c, kind, in, src, out, dst, n); break;
    default: break;
  }
}

// Accesses another agent (thread 0 of a peer block, another rank, the host) observes.
// Device: volatile (ordered by the explicit __threadfence_system calls). Host simulation:
// acquire loads and release stores, which give the same order on the CPU and let
// ThreadSanitizer see the synchronisation.
#if CCL_HOST_SIM
__device__ inline uint64_t ccl_ld64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
__device__ inline void ccl_st64(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
__device__ inline uint32_t ccl_ld32(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
__device__ inline void ccl_st32(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
#else
__device__ inline uint64_t ccl_ld64(const uint64_t *p) { return *(const volatile uint64_t *)p; }
__device__ inline void ccl_st64(uint64_t *p, uint64_t v) { *(volatile uint64_t *)p = v; }
__device__ inline uint32_t ccl_ld32(const uint32_t *p) { return *(const volatile uint32_t *)p; }
__device__ inline void ccl_st32(uint32_t *p, uint32_t v) { *(volatile uint32_t *)p = v; }
#endif
__device__ inline uint64_t vload(const uint64_t *p) { return ccl_ld64(p); }
__device__ inline void vstore(uint64_t *p, uint64_t v) { ccl_st64(p, v); }
// The check area's stop word: some block of this communicator's kernels saw a descriptor
// mismatch (or a poison descriptor).
__device__ inline bool check_stopped(const ccl_dev_plan_t &p) {
  return p.check && ccl_ld64(p.check) != 0;
}

// The start gate is open (or there is none: no frame or no abort flag's memory).
__device__ inline bool gate_open(const ccl_dev_plan_t &p) {
  if (!p.frame || !p.abort_flag) return true;
  return (int32_t)(ccl_ld32(p.abort_flag + CCL_GATE_WORD) - p.start_gate) >= 0;
}

// The abort flag (mapped host memory the host sets; NULL: never aborts), or the check's
// stop word.
__device__ inline bool abort_requested(const ccl_dev_plan_t &p) {
  // Both words are mapped host memory, where every read crosses the bus: issue both loads
  // before using either, so that they overlap (one round trip, not two in a row).
  uint32_t a = p.abort_flag ? ccl_ld32(p.abort_flag) : 0u;
  uint64_t s = p.check ? ccl_ld64(p.check) : 0u;
  return a != 0u || s != 0u;
}

__device__ inline bool step_sends(uint32_t k) {
  return k == CCL_STEP_SEND || k == CCL_STEP_RECV_REDUCE_SEND ||
         k == CCL_STEP_RECV_REDUCE_COPY_SEND || k == CCL_STEP_RECV_COPY_SEND;
}
__device__ inline bool step_recvs(uint32_t k) { return k != CCL_STEP_SEND; }

// Nanoseconds of a free-running device clock (only differences are used).
__device__ inline uint64_t ccl_now_ns() {
#if CCL_HOST_SIM
  return ccl_sim::now_ns();
#elif CCL_PLATFORM_HIP
#if defined(__HIP_DEVICE_COMPILE__)
  // HIP: the constant-rate real-time counter behind wall_clock64() (s_memrealtime,
  // 100 MHz on gfx90a / gfx942: 10 ns per tick).
  return (uint64_t)__builtin_amdgcn_s_memrealtime() * 10ull;
#else
  return 0;  // host pass of hipcc: never called
#endif
#else
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#endif
}

struct LaneState {
  uint32_t lane;
  uint32_t pos;
  uint64_t posted;   // messages this lane has sent on conn_out (its tail)
  uint64_t consumed; // messages this lane has consumed on conn_in (its head)
  uint32_t synced;   // LL: the receiver acknowledged conn_out's scrub (or none was needed)
  uint32_t checked;  // descriptor check: CHECKED_IN first receive verified, CHECKED_OUT
                     // first send's descriptor written (see ccl_device.h)
};

#define CHECKED_IN 1u
#define CHECKED_OUT 2u

// ---------------------------------------------------------------------------------------
// LL protocol (CCL_PROTO_LL, see ccl_device.h): 16-byte lines {data0, flag0, data1, flag1}
// ---------------------------------------------------------------------------------------

// The flag of message m (1-based count of messages sent on the connection).
__device__ inline uint32_t ll_flag(uint64_t m) { return (uint32_t)m; }

// Both halves of a line carry flag f.
__device__ inline bool ll_line_has(uint64_t lo, uint64_t hi, uint32_t f) {
  return (uint32_t)(lo >> 32) == f && (uint32_t)(hi >> 32) == f;
}

__device__ inline const uint64_t *ll_slot(const ccl_dev_conn_t &c, uint64_t k) {
  return (const uint64_t *)((const char *)c.slots + (k % c.nslots) * c.slot_bytes);
}

// Whole block: waits for the nb payload bytes of message m (flag ll_flag(m)) in `lines`
// and unpacks them into `in` (shared memory, whole 8-byte words). Returns false on abort
// (this thread saw the flag set while waiting).
__device__ bool ll_recv_block(const ccl_dev_plan_t &p, const uint64_t *lines, uint32_t f,
                              uint64_t nb, uint64_t *in) {
  uint64_t nlines = (nb + 7) / 8;
  for (uint64_t i = threadIdx.x; i < nlines; i += blockDim.x) {
    uint64_t lo, hi;
    uint32_t spins = 0;
    for (;;) {
      // Two 8-byte volatile loads: each half's data is valid when its own flag matches
      // (the sender stored data and flag with one 8-byte store).
      lo = ccl_ld64(&lines[2 * i]);
      hi = ccl_ld64(&lines[2 * i + 1]);
      if (ll_line_has(lo, hi, f)) break;
      if ((++spins & CCL_ABORT_POLL_MASK) == 0 && abort_requested(p)) return false;
      CCL_SPIN_PAUSE();
    }
    in[i] = (lo & 0xFFFFFFFFull) | (hi << 32);
  }
  return true;
}

// Whole block: stores the nb payload bytes of `out` (shared memory) as lines with flag f;
// the last line's bytes beyond nb are zero.
__device__ void ll_send_block(uint64_t *lines, uint32_t f, uint64_t nb, const uint64_t *out) {
  uint64_t nlines = (nb + 7) / 8;
  uint64_t fl = (uint64_t)f << 32;
  for (uint64_t i = threadIdx.x; i < nlines; i += blockDim.x) {
    uint64_t v = out[i];
    uint64_t rest = nb - i * 8;
    if (rest < 8) v &= (1ull << (rest * 8)) - 1;
    ccl_st64(&lines[2 * i], (v & 0xFFFFFFFFull) | fl);
    ccl_st64(&lines[2 * i + 1], (v >> 32) | fl);
  }
}

// Whole block: zeroes the LL part of every slot of c, then (thread 0, after a fence)
// publishes the scrub in head[1] for the sender.
__device__ void ll_scrub_block(const ccl_dev_conn_t &c) {
  uint64_t words = 2 * (uint64_t)CCL_LL_CHUNK(c.slot_bytes) / 8;
  for (uint32_t k = 0; k < c.nslots; k++) {
    uint64_t *w = (uint64_t *)((char *)c.slots + (uint64_t)k * c.slot_bytes);
    for (uint64_t i = threadIdx.x; i < words; i += blockDim.x) ccl_st64(&w[i], 0);
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) vstore(c.head + 1, c.ll_sync);
}

// ---------------------------------------------------------------------------------------
// The descriptor check (see CCL_DESC_WORDS in ccl_device.h); thread 0 only
// ---------------------------------------------------------------------------------------

// Messages posted according to a tail value (without CCL_TAIL_POISON).
__device__ inline uint64_t tail_count(uint64_t t) { return t & ~CCL_TAIL_POISON; }

// A tail value read by a receiver about to consume message k: message k is the poison.
__device__ inline bool poison_next(uint64_t t, uint64_t k) {
  return (t & CCL_TAIL_POISON) != 0 && tail_count(t) == k + 1;
}

__device__ inline uint64_t *desc_slot(const ccl_dev_conn_t &c, uint64_t k) {
  return c.descs + (k % c.nslots) * CCL_DESC_WORDS;
}

__device__ inline bool desc_equal(const uint64_t *got, const uint64_t *want) {
  for (int i = 0; i < CCL_DESC_WORDS; i++)
    if (got[i] != want[i]) return false;
  return true;
}

__device__ inline void desc_read(const ccl_dev_conn_t &c, uint64_t k, uint64_t *got) {
  const uint64_t *d = desc_slot(c, k);
  for (int i = 0; i < CCL_DESC_WORDS; i++) got[i] = ccl_ld64(&d[i]);
}

// Before message k's data: its descriptor.
__device__ inline void desc_write(const ccl_dev_conn_t &c, uint64_t k, const uint64_t *w) {
  uint64_t *d = desc_slot(c, k);
  for (int i = 0; i < CCL_DESC_WORDS; i++) ccl_st64(&d[i], w[i]);
}

// Message k on c is there (after the acquire fence): 0 its descriptor matches `want`,
// 1 not visible yet (LL only: the flags may be seen before the descriptor; the tail, stored
// after a fence, settles it), 2 a mismatch (`got` holds what arrived).
__device__ inline int desc_verdict(const ccl_dev_conn_t &c, uint64_t k, const uint64_t *want,
                                   bool ll, uint64_t *got) {
  desc_read(c, k, got);
  if (desc_equal(got, want)) return 0;
  if (ll) {
    if (tail_count(vload(c.tail)) <= k) return 1;
    __threadfence_system();
    desc_read(c, k, got);
    if (desc_equal(got, want)) return 0;
  }
  return 2;
}

// Fills channel ch's record of the check area and raises its stop word.
__device__ void check_record(const ccl_dev_plan_t &p, uint32_t ch, int32_t conn,
                             const uint64_t *got, const uint64_t *want) {
  uint64_t *r = (uint64_t *)((char *)p.check + CCL_CHECK_RECORD_OFFSET(ch));
  ccl_st64(&r[1], (uint64_t)(uint32_t)conn);
  for (int i = 0; i < CCL_DESC_WORDS; i++) {
    ccl_st64(&r[2 + i], got[i]);
    ccl_st64(&r[2 + CCL_DESC_WORDS + i], want[i]);
  }
  __threadfence_system();
  ccl_st64(&r[0], 1);
  __threadfence_system();
  ccl_st64(p.check, 1);
}

// Message k on c (there: the caller saw it) is a poison descriptor.
__device__ inline bool poison_waits(const ccl_dev_conn_t &c, uint64_t k) {
  return c.descs && ccl_ld64(&desc_slot(c, k)[1]) >> 56 == CCL_DESC_POISON_MARK;
}

// The poison descriptor as message k on c, and the tail with CCL_TAIL_POISON (after a
// fence: the receiver that sees the bit also sees the descriptor, in both protocols).
__device__ void poison_conn(const ccl_dev_plan_t &p, const ccl_dev_conn_t &c, uint64_t k) {
  uint64_t w[CCL_DESC_WORDS] = {~0ull, (CCL_DESC_POISON_MARK << 56) | p.rank, 0};
  desc_write(c, k, w);
  __threadfence_system();
  vstore(c.tail, (k + 1) | CCL_TAIL_POISON);
}

// ---------------------------------------------------------------------------------------
// The kernel
// ---------------------------------------------------------------------------------------

// Thread 0's decision for one pass of the scheduler loop.
struct Decision {
  int32_t go;    // index into st of the lane whose step runs now, -1 none
  uint32_t stop; // 1: abort requested
};

// The block's shared memory.
struct KernelShared {
  LaneState st[CCL_MAX_LANES_PER_CHANNEL];
  uint32_t n_mine;
  // Double-buffered by pass parity: thread 0 writes pass i+1's decision while slow threads
  // may still read pass i's (they read it after the barrier that follows its write, and
  // thread 0 cannot write the same entry again before every thread passed the barrier of
  // pass i+1). A single shared `go` raced: on an idle pass thread 0 looped back and
  // rewrote it while other threads had not read it yet.
  Decision dec[2];
  uint64_t sends, recvs;
  // LL staging of one step's input and output (payload bytes, whole 8-byte words).
  alignas(16) uint64_t ll_in[CCL_LL_MAX_CHUNK / 8];
  alignas(16) uint64_t ll_out[CCL_LL_MAX_CHUNK / 8];
};

// The plan kernel's work in one block (ccl_plan_kernel adds the completion word).
__device__ inline void plan_block(const ccl_dev_plan_t &p) {
  CCL_BLOCK_SHARED(KernelShared, sh);
  LaneState *st = sh.st;
  uint32_t &n_mine = sh.n_mine;
  uint64_t &sends = sh.sends;
  uint64_t &recvs = sh.recvs;
  uint64_t *ll_in = sh.ll_in;
  uint64_t *ll_out = sh.ll_out;
  const uint32_t ch = blockIdx.x;
  const bool ll = p.proto == CCL_PROTO_LL;
  RedCtx c;
  c.op = p.op;
  c.avg_divisor = p.avg_divisor;
  c.scalar_bits = p.scalar_bits;
  if (p.scalar_dev) memcpy(&c.scalar_bits, p.scalar_dev, p.unit <= 8 ? p.unit : 8);
  // An aborted communicator's kernel touches nothing: its peers may have freed the FIFOs
  // it would read (ncclCommAbort of every rank).
  // The start gate (ccl_dev_plan_t.start_gate): the host prepares the frame block this
  // kernel writes, then opens the gate.
  if (threadIdx.x == 0) {
    for (;;) {
      bool open = gate_open(p);
      if (abort_requested(p)) {
        sh.dec[0].stop = 1u;
        break;
      }
      if (open) {
        sh.dec[0].stop = 0u;
        break;
      }
#if !CCL_PLATFORM_HIP && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 700)
      __nanosleep(200);
#endif
    }
  }
  __syncthreads();
  if (sh.dec[0].stop) return;

  // Local steps: every block takes its share of each (disjoint from lane outputs).
  for (uint32_t l = 0; l < p.n_locals; l++) {
    const ccl_dev_local_t &lc = p.locals[l];
    uint64_t per = (lc.count + gridDim.x - 1) / gridDim.x;
    uint64_t b = per * ch;
    if (b >= lc.count) continue;
    uint64_t n = lc.count - b < per ? lc.count - b : per;
    const char *src = (const char *)p.bufs[lc.src_buf] + (lc.src_off + b) * p.unit;
    char *dst = (char *)p.bufs[lc.dst_buf] + (lc.dst_off + b) * p.unit;
    if (lc.kind == CCL_LOCAL_COPY) {
      if (src != dst) copy_block(src, NULL, dst, n * p.unit);
    } else {
      // dst = finish(pre(src)); element-wise, so src == dst is fine.
      switch (p.dtype) {
#define CCL_LOCAL_CASE(DT, K) \
  case DT: reduce_block<K>(c, NULL, src, NULL, dst, n, true); break;
        CCL_LOCAL_CASE(CCL_DT_INT8, KI8)
        CCL_LOCAL_CASE(CCL_DT_UINT8, KU8)
        CCL_LOCAL_CASE(CCL_DT_INT32, KI32)
        CCL_LOCAL_CASE(CCL_DT_UINT32, KU32)
        CCL_LOCAL_CASE(CCL_DT_INT64, KI64)
        CCL_LOCAL_CASE(CCL_DT_UINT64, KU64)
        CCL_LOCAL_CASE(CCL_DT_FLOAT16, KF16)
        CCL_LOCAL_CASE(CCL_DT_FLOAT32, KF32)
        CCL_LOCAL_CASE(CCL_DT_FLOAT64, KF64)
        CCL_LOCAL_CASE(CCL_DT_BFLOAT16, KBF16)
        CCL_LOCAL_CASE(CCL_DT_FLOAT8E4M3, KE4M3)
        CCL_LOCAL_CASE(CCL_DT_FLOAT8E5M2, KE5M2)
#undef CCL_LOCAL_CASE
        default: break;
      }
    }
  }

  if (threadIdx.x == 0) {
    uint32_t k = 0;
    for (uint32_t i = 0; i < p.n_lanes && k < CCL_MAX_LANES_PER_CHANNEL; i++) {
      const ccl_dev_lane_t &ln = p.lanes[i];
      if (ln.channel != ch || ln.n_steps == 0) continue;
      st[k].lane = i;
      st[k].pos = 0;
      st[k].posted = ln.conn_out >= 0 ? tail_count(vload(p.conns[ln.conn_out].tail)) : 0;
      st[k].consumed = ln.conn_in >= 0 ? vload(p.conns[ln.conn_in].head) : 0;
      st[k].synced = !ll || ln.conn_out < 0 || p.conns[ln.conn_out].ll_sync == 0;
      st[k].checked = 0;
      k++;
    }
    n_mine = k;
    // dec[0] is written again only in pass 0 (after the barrier below); its stop is 0.
    sh.dec[1].stop = 0;
    sends = 0;
    recvs = 0;
  }
  __syncthreads();
  if (ll) {
    // Inbound FIFOs whose slots may hold bytes that are not LL lines of this connection
    // (never-initialised memory, earlier Simple messages): zero the LL part before any
    // sender may write (it waits for head[1] == ll_sync). The condition is uniform.
    for (uint32_t k = 0; k < n_mine; k++) {
      const ccl_dev_lane_t &ln = p.lanes[st[k].lane];
      if (ln.conn_in >= 0 && p.conns[ln.conn_in].ll_sync != 0) ll_scrub_block(p.conns[ln.conn_in]);
    }
  }

  uint64_t *send_word = NULL;
  uint64_t *wait_word = NULL;  // upstream ns; downstream ns at +1
  if (p.frame && ch < p.frame_capacity) {
    send_word = (uint64_t *)((char *)p.frame + CCL_FRAME_SEND_OFFSET(p.frame_capacity, p.frame_block, ch));
    wait_word = (uint64_t *)((char *)p.frame + CCL_FRAME_WAIT_OFFSET(p.frame_capacity, p.frame_block, ch));
  }
  // Injected faults (thread 0's state): does this channel stall; when may the channel's
  // next throttled send start.
  const bool stalled = p.stall_channel == CCL_STALL_ALL || p.stall_channel == ch;
  uint64_t next_send = 0;
  bool have_next = false;
  // Wait accounting (thread 0): cumulative ns per reason, the episode's start and the
  // reasons seen at its last idle pass.
  uint64_t wait_up = 0, wait_down = 0, ep_start = 0;
  bool ep_up = false, ep_down = false;

  uint32_t remaining = n_mine;
  uint32_t cursor = 0;
  uint32_t idle = 0;
  uint32_t pass = 0;
  while (remaining > 0) {
    Decision &d = sh.dec[pass & 1u];
    pass++;
    if (threadIdx.x == 0) {
      // Find a lane whose next step can run, starting after the last one served.
      d.go = -1;
      bool up = false, down = false;
      // The chosen lane's inbound tail as read below (0: not read): carries the poison bit.
      uint64_t tail_seen = 0;
      for (uint32_t t = 0; t < n_mine; t++) {
        uint32_t k = (cursor + t) % n_mine;
        LaneState &s = st[k];
        const ccl_dev_lane_t &ln = p.lanes[s.lane];
        if (s.pos >= ln.n_steps) continue;
        if (stalled && s.pos >= p.stall_after) {
          up = true;
          continue;
        }
        uint32_t kind = p.steps[ln.first_step + s.pos].kind;
        tail_seen = 0;
        if (step_recvs(kind)) {
          const ccl_dev_conn_t &ci = p.conns[ln.conn_in];
          if (ll) {
            // Peek the flags of the slot's first line instead of tail (or the tail: a
            // poison message and a descriptor-only message, count 0, have no lines).
            const uint64_t *l0 = ll_slot(ci, s.consumed);
            if (!ll_line_has(ccl_ld64(&l0[0]), ccl_ld64(&l0[1]), ll_flag(s.consumed + 1))) {
              if ((p.check && ci.descs) || p.steps[ln.first_step + s.pos].count == 0)
                tail_seen = vload(ci.tail);
              if (tail_count(tail_seen) <= s.consumed) {
                up = true;
                continue;
              }
            }
          } else {
            tail_seen = vload(ci.tail);
            if (tail_count(tail_seen) <= s.consumed) {
              up = true;
              continue;
            }
          }
        }
        bool throttled = false;
        bool blocked = false;  // its send side waits for the receiver
        if (step_sends(kind)) {
          const ccl_dev_conn_t &co = p.conns[ln.conn_out];
          if (s.posted - vload(co.head) >= co.nslots) {
            blocked = true;
          } else if (!s.synced && vload(co.head + 1) != co.ll_sync) {
            blocked = true;
          } else {
            s.synced = 1;
            throttled = (ln.flags & CCL_LANE_THROTTLED) && p.throttle_gap_ns != 0;
            if (throttled && have_next && ccl_now_ns() < next_send) {
              down = true;
              continue;
            }
          }
        }
        if (blocked) {
          // A poison waiting on the receive side of a lane whose send side is blocked
          // fails the lane now: the poisoning rank will never drain the send side. (A lane
          // that can run meets a poison in its step's descriptor check.)
          if (p.check && step_recvs(kind) && poison_waits(p.conns[ln.conn_in], s.consumed)) {
            uint64_t got[CCL_DESC_WORDS];
            desc_read(p.conns[ln.conn_in], s.consumed, got);
            check_record(p, ch, ln.conn_in, got,
                         p.desc[p.steps[ln.first_step + s.pos].dst_buf % CCL_MAX_BUFS]);
            d.stop = 1;
            break;
          }
          down = true;
          continue;
        }
        if (throttled) {
          // The gap starts now; the channel's next throttled send waits for it.
          next_send = ccl_now_ns() + p.throttle_gap_ns;
          have_next = true;
        }
        d.go = (int32_t)k;
        cursor = k + 1;
        break;
      }
      if (d.go >= 0) {
        // Acquire: the data behind the observed tail/head is visible after this fence.
        __threadfence_system();
        if (p.check) {
          // The descriptor check of the chosen step (see CCL_DESC_WORDS): the lane's first
          // receive of the operation is verified, later ones only for the poison bit of
          // the tail already read; the first send carries the descriptor.
          LaneState &s = st[d.go];
          const ccl_dev_lane_t &ln = p.lanes[s.lane];
          const ccl_dev_step_t &stp = p.steps[ln.first_step + s.pos];
          if (step_recvs(stp.kind) && p.conns[ln.conn_in].descs &&
              (!(s.checked & CHECKED_IN) || poison_next(tail_seen, s.consumed))) {
            uint64_t got[CCL_DESC_WORDS];
            const uint64_t *want = p.desc[stp.dst_buf % CCL_MAX_BUFS];
            int v = desc_verdict(p.conns[ln.conn_in], s.consumed, want, ll, got);
            if (v == 2) {
              check_record(p, ch, ln.conn_in, got, want);
              d.stop = 1;
            }
            if (v != 0) d.go = -1;
            else s.checked |= CHECKED_IN;
          }
          if (d.go >= 0 && step_sends(stp.kind) && p.conns[ln.conn_out].descs &&
              !(s.checked & CHECKED_OUT)) {
            desc_write(p.conns[ln.conn_out], s.posted, p.desc[stp.src_buf % CCL_MAX_BUFS]);
            s.checked |= CHECKED_OUT;
          }
        }
      }
      if (d.go < 0) {
        idle++;
        if (idle == 2) ep_start = ccl_now_ns();
        if (idle >= 2) {
          ep_up = up;
          ep_down = down;
        }
        if ((idle & CCL_ABORT_POLL_MASK) == 0 && abort_requested(p)) d.stop = 1;
#if !CCL_PLATFORM_HIP && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 700)
        __nanosleep(100);
#endif
      } else {
        if (idle >= 2) {
          // A wait episode ended: charge it to the reasons of its last idle pass (absolute
          // values, one store per reason, after the system fence, like the counts).
          uint64_t ns = ccl_now_ns() - ep_start;
          if (ep_up) wait_up += ns;
          if (ep_down) wait_down += ns;
          if (wait_word && ep_up) vstore(wait_word, wait_up);
          if (wait_word && ep_down) vstore(wait_word + 1, wait_down);
        }
        idle = 0;
      }
    }
    __syncthreads();
    if (d.stop) break;
    int32_t k = d.go;
    if (k < 0) continue;
    LaneState &s = st[k];
    const ccl_dev_lane_t &ln = p.lanes[s.lane];
    const ccl_dev_step_t &stp = p.steps[ln.first_step + s.pos];
    const void *in = NULL;
    void *out = NULL;
    if (step_recvs(stp.kind)) {
      const ccl_dev_conn_t &ci = p.conns[ln.conn_in];
      in = (const char *)ci.slots + (s.consumed % ci.nslots) * ci.slot_bytes;
    }
    if (step_sends(stp.kind)) {
      const ccl_dev_conn_t &co = p.conns[ln.conn_out];
      out = (char *)co.slots + (s.posted % co.nslots) * co.slot_bytes;
    }
    const void *src = (const char *)p.bufs[stp.src_buf] + stp.src_off * p.unit;
    void *dst = (char *)p.bufs[stp.dst_buf] + stp.dst_off * p.unit;
    if (ll) {
      // (1) wait for the lines and unpack into shared memory, (2) the typed step code on
      // shared memory, (3) pack the output into lines with the message's flag.
      uint64_t nb = stp.count * p.unit;
      uint64_t cap = CCL_LL_MAX_CHUNK;
      if (in) cap = cap < CCL_LL_CHUNK(p.conns[ln.conn_in].slot_bytes) ? cap : CCL_LL_CHUNK(p.conns[ln.conn_in].slot_bytes);
      if (out) cap = cap < CCL_LL_CHUNK(p.conns[ln.conn_out].slot_bytes) ? cap : CCL_LL_CHUNK(p.conns[ln.conn_out].slot_bytes);
      if (nb > cap) {
        // The host plans LL chunks that fit (ccl_core::device::proto); never overrun.
        if (threadIdx.x == 0) printf("ccl_plan_kernel: LL step of %llu bytes exceeds %llu\n",
                                     (unsigned long long)nb, (unsigned long long)cap);
        break;
      }
      // Abort seen by any thread while waiting for lines: the whole block stops (a barrier
      // with an OR, no shared flag written by several threads).
      bool aborted = in && !ll_recv_block(p, (const uint64_t *)in, ll_flag(s.consumed + 1), nb, ll_in);
      if (__syncthreads_or(aborted)) break;
      run_step(p, c, stp.kind, in ? ll_in : NULL, src, out ? ll_out : NULL, dst, stp.count);
      __syncthreads();
      if (out) ll_send_block((uint64_t *)out, ll_flag(s.posted + 1), nb, ll_out);
    } else {
      run_step(p, c, stp.kind, in, src, out, dst, stp.count);
    }
    // Release: every thread's writes are ordered before thread 0's counter stores.
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) {
      // The probe counts data messages: a descriptor-only message (count 0) is not one,
      // as on the host backend (ccl_core::schedule::Lane::step_counts).
      const uint64_t counted = stp.count != 0 ? 1 : 0;
      if (step_sends(stp.kind)) {
        s.posted++;
        vstore(p.conns[ln.conn_out].tail, s.posted);
        sends += counted;
      }
      if (step_recvs(stp.kind)) {
        s.consumed++;
        vstore(p.conns[ln.conn_in].head, s.consumed);
        recvs += counted;
      }
      if (send_word) {
        __threadfence_system();
        if (step_sends(stp.kind)) vstore(send_word, sends);
        if (step_recvs(stp.kind)) vstore(send_word + 1, recvs);
      }
      s.pos++;
    }
    __syncthreads();
    if (s.pos >= ln.n_steps) remaining--;
  }
  // Stopped by a descriptor mismatch of this communicator: poison the outbound
  // connections (the peers waiting for our next message fail instead of hanging).
  if (threadIdx.x == 0 && remaining > 0 && check_stopped(p)) {
    for (uint32_t k = 0; k < n_mine; k++) {
      const ccl_dev_lane_t &ln = p.lanes[st[k].lane];
      if (ln.conn_out >= 0 && p.conns[ln.conn_out].descs)
        poison_conn(p, p.conns[ln.conn_out], st[k].posted);
    }
  }
}

__global__ void __launch_bounds__(CCL_THREADS) ccl_plan_kernel(ccl_dev_plan_t p) {
  plan_block(p);
  // The block's completion word (ccl_dev_plan_t.done), however the block ended (every
  // return and break in plan_block is uniform across the block).
  if (p.done) {
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence_system();
      ccl_st32(&p.done[blockIdx.x], p.start_gate);
    }
  }
}


}  // namespace

#endif  // CCL_KERNEL_BODY_H
