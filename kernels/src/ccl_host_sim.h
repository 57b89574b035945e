// ccl_host_sim.h - the portability layer that lets the device part of the kernels
// (ccl_kernel_body.h) compile with the system C++ compiler and run on the CPU.
//
// * A block is CCL_THREADS OS threads; threadIdx / blockIdx / blockDim / gridDim are
//   thread-locals set by the launcher (host_kernel.cpp) before a thread enters the kernel.
// * __syncthreads / __syncthreads_or are a per-block barrier (mutex + condition variable,
//   which also orders the block's plain memory accesses, as the CUDA barrier does).
// * __shared__ state is one object per block (CCL_BLOCK_SHARED in ccl_kernel_body.h).
// * __threadfence_system is a sequentially consistent fence; the flag and counter accesses
//   the body makes through ccl_ld64 / ccl_st64 are acquire / release atomics.
// * __half, __nv_bfloat16 and the fp8 conversions are software types with the hardware's
//   rounding: round to nearest even; f16 / bf16 overflow to infinity; fp8 with
//   __NV_SATFINITE clamps finite overflow and infinities to the largest finite value
//   (e4m3 448, e5m2 57344), NaN to 0x7F.
// * __nanosleep and the spin loops yield the CPU (the machine may have fewer cores than
//   the simulated threads).
#ifndef CCL_HOST_SIM_H
#define CCL_HOST_SIM_H

#include <stdint.h>
#include <string.h>

#define CCL_HOST_SIM 1
#define CCL_PLATFORM_HIP 0

#define __host__
#define __device__
#define __global__
#define __launch_bounds__(n)

struct dim3 {
  unsigned x, y, z;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

namespace ccl_sim {

// The calling thread's coordinates (set by the launcher).
inline thread_local dim3 thread_idx = {0, 0, 0};
inline thread_local dim3 block_idx = {0, 0, 0};
inline thread_local dim3 block_dim = {1, 1, 1};
inline thread_local dim3 grid_dim = {1, 1, 1};

// Barrier of the calling thread's block; returns the OR of `pred` over the block.
int barrier(int pred);
// The calling thread's block-shared object.
void *block_shared();
// Lets other threads run (spin loops, __nanosleep): yields for the first calls of a
// streak of waiting, then sleeps 50 us per call (the machine may have far fewer cores
// than simulated threads; a block's idle pass costs a barrier of all its threads).
void spin_pause();
// Monotonic nanoseconds (the device's global timer).
uint64_t now_ns();

// Round-to-nearest-even encoding of an f32 into a float format with EBITS exponent and
// MBITS mantissa bits (IEEE-like: the top exponent holds infinities and NaN). Returns the
// code without sign handling of NaN (callers treat NaN first).
template <unsigned EBITS, unsigned MBITS>
inline uint32_t encode_rne(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  const uint32_t sign = (b >> 31) << (EBITS + MBITS);
  const int bias = (1 << (EBITS - 1)) - 1;
  const uint32_t emax_code = (1u << EBITS) - 1;  // infinity's exponent code
  uint32_t abs = b & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) return sign | (emax_code << MBITS);  // infinity (NaN handled by callers)
  int e = (int)(abs >> 23) - 127;                               // unbiased exponent
  uint32_t m = abs & 0x7FFFFFu;
  if (abs == 0) return sign;
  // Significand with the implicit bit (f32 subnormals: no implicit bit, exponent -126).
  uint64_t sig = (abs >> 23) ? (m | 0x800000u) : m;
  if ((abs >> 23) == 0) e = -126;
  // Target exponent: normal if e >= 1 - bias, else subnormal with exponent 1 - bias.
  int te = e < 1 - bias ? 1 - bias : e;
  // Bits to drop from sig (23 fraction bits) to keep MBITS fraction bits at exponent te.
  int shift = 23 - (int)MBITS + (te - e);
  uint64_t q;
  if (shift >= 64) {
    q = 0;
  } else if (shift <= 0) {
    q = sig << (-shift);
  } else {
    uint64_t rem = sig & ((1ull << shift) - 1);
    uint64_t half = 1ull << (shift - 1);
    q = sig >> shift;
    if (rem > half || (rem == half && (q & 1))) q++;
  }
  // q: significand at exponent te with MBITS fraction bits (implicit bit included when
  // normal). Carry into the next binade is handled by the addition below.
  uint32_t code;
  if (te == 1 - bias && q < (1ull << MBITS)) {
    code = (uint32_t)q;  // subnormal (or zero)
  } else {
    uint64_t ecode = (uint64_t)(te + bias);
    // q may be 2^(MBITS+1) after rounding: one more exponent step.
    code = (uint32_t)((ecode << MBITS) + (q - (1ull << MBITS)));
  }
  if ((code >> MBITS) >= emax_code) code = emax_code << MBITS;  // overflow: infinity
  return sign | code;
}

}  // namespace ccl_sim

#define threadIdx (ccl_sim::thread_idx)
#define blockIdx (ccl_sim::block_idx)
#define blockDim (ccl_sim::block_dim)
#define gridDim (ccl_sim::grid_dim)
#define __syncthreads() ((void)ccl_sim::barrier(0))
#define __syncthreads_or(pred) ccl_sim::barrier((pred) ? 1 : 0)
#define __threadfence_system() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define __nanosleep(ns) ccl_sim::spin_pause()

// ---- software small floats (the subset of cuda_fp16.h / cuda_bf16.h / cuda_fp8.h the
// body uses) ----------------------------------------------------------------------------

struct __half_raw {
  unsigned short x;
};
struct __half {
  unsigned short x;
  __half() = default;
  __half(__half_raw r) : x(r.x) {}
  operator __half_raw() const { return __half_raw{x}; }
};
inline float __half2float(__half h) {
  // Exact: every f16 is an f32.
  uint32_t x = h.x, sign = (x & 0x8000u) << 16, em = x & 0x7FFFu, r;
  if (em >= 0x7C00u) {
    r = 0x7F800000u | ((em & 0x3FFu) << 13);
  } else if (em >= 0x0400u) {
    r = (em << 13) + ((127u - 15u) << 23);
  } else {
    // Subnormal: em * 2^-24, exact in float.
    float f = (float)em * (1.0f / 16777216.0f);
    memcpy(&r, &f, 4);
  }
  r |= sign;
  float f;
  memcpy(&f, &r, 4);
  return f;
}
inline __half __float2half_rn(float f) {
  __half_raw r;
  if (f != f) {
    r.x = 0x7FFF;
  } else {
    r.x = (unsigned short)ccl_sim::encode_rne<5, 10>(f);
  }
  return __half(r);
}

struct __nv_bfloat16_raw {
  unsigned short x;
};
struct __nv_bfloat16 {
  unsigned short x;
  __nv_bfloat16() = default;
  __nv_bfloat16(__nv_bfloat16_raw r) : x(r.x) {}
  operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{x}; }
};
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  __nv_bfloat16_raw r;
  if (f != f) {
    r.x = 0x7FFF;
  } else {
    r.x = (unsigned short)ccl_sim::encode_rne<8, 7>(f);
  }
  return __nv_bfloat16(r);
}

typedef unsigned char __nv_fp8_storage_t;
enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE };
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };

inline __nv_fp8_storage_t __nv_cvt_float_to_fp8(float f, __nv_saturation_t sat,
                                                __nv_fp8_interpretation_t kind) {
  if (f != f) return 0x7F;
  uint32_t b;
  memcpy(&b, &f, 4);
  uint32_t sign = (b >> 24) & 0x80u;
  if (kind == __NV_E5M2) {
    // IEEE-like: RNE, overflow to infinity (0x7C) or, saturating, to 57344 (0x7B).
    uint32_t c = ccl_sim::encode_rne<5, 2>(f) & 0x7Fu;
    if (c >= 0x7Cu) c = sat == __NV_SATFINITE ? 0x7Bu : 0x7Cu;
    return (__nv_fp8_storage_t)(sign | c);
  }
  // E4M3 (OCP "fn"): no infinities; exponent code 15 is a normal binade [256, 512) whose
  // top code 0x7F is NaN, so the largest finite value is 448 (0x7E).
  uint32_t abs = b & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) return (__nv_fp8_storage_t)(sat == __NV_SATFINITE ? (sign | 0x7Eu) : 0x7Fu);
  float a;
  memcpy(&a, &abs, 4);
  uint32_t c;
  if (a >= 512.0f) {
    c = 0x7Fu;  // out of range
  } else if (a >= 256.0f) {
    // Binade [256, 512): 256 + 32 j -> code 0x78 + j; RNE on the remainder (exact
    // arithmetic: a is a float below 512 and k * 32 is exact).
    uint32_t k = (uint32_t)(a / 32.0f);
    float rem = a - 32.0f * (float)k;
    if (rem > 16.0f || (rem == 16.0f && (k & 1u))) k++;
    c = 0x70u + k;  // k = 8 (256) -> 0x78; k = 15 (480) -> 0x7F, out of range
  } else {
    // Below 256 the IEEE-like encoder is exact; a value rounding up to 256 comes back as
    // its "infinity" code 0x78, which is 256 in e4m3.
    c = ccl_sim::encode_rne<4, 3>(f) & 0x7Fu;
  }
  if (c > 0x7Eu) c = sat == __NV_SATFINITE ? 0x7Eu : 0x7Fu;
  return (__nv_fp8_storage_t)(sign | c);
}

#endif  // CCL_HOST_SIM_H
