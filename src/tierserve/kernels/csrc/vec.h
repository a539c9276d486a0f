// Portable SIMD through GCC vector extensions: one `vf` is the widest float vector the build
// machine has (-march=native): 16 lanes with AVX-512, 8 with AVX2/AVX, 4 otherwise. The build
// passes -ffp-contract=off: `a * b + c` rounds twice, and a fused multiply-add is an explicit
// `vfma`, so that every kernel's rounding is what its source says.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace tierserve {

#if defined(__AVX512F__)
constexpr int VL = 16;
#elif defined(__AVX__)
constexpr int VL = 8;
#else
constexpr int VL = 4;
#endif

typedef float vf __attribute__((vector_size(VL * 4)));
typedef float vf_unaligned __attribute__((vector_size(VL * 4), aligned(4)));
typedef int32_t vi __attribute__((vector_size(VL * 4)));
typedef uint32_t vu __attribute__((vector_size(VL * 4)));

inline vf vload(const float* p) { return *reinterpret_cast<const vf_unaligned*>(p); }
inline void vstore(float* p, vf v) { *reinterpret_cast<vf_unaligned*>(p) = v; }
inline vf vbroadcast(float x) { return vf{} + x; }

// a * b + c in one rounding. Explicit, not left to the compiler's contraction of `a * b + c`:
// GCC contracts it in some inlined instances of a template and not in others (measured: an
// AVX2 build's one-vector GEMM tile ran vmulps + vaddps where the wider tiles ran FMA), and
// kernels that promise the same bits for any tiling, path or thread count need one rounding
// rule. One instruction in asm: through the intrinsic GCC 12 kept run_lanes' 24 score
// accumulators in memory as well as in registers (a store after every FMA, 1.45x slower).
inline vf vfma(vf a, vf b, vf c) {
#if defined(__AVX512F__) || (defined(__AVX__) && defined(__FMA__))
  asm("vfmadd231ps %2, %1, %0" : "+v"(c) : "v"(a), "v"(b));
  return c;
#else
  return a * b + c;
#endif
}

// Horizontal sum as a fixed pairwise tree (log2(VL) dependent adds, not VL).
inline float vsum(vf v) {
  float t[VL];
  std::memcpy(t, &v, sizeof(t));
  for (int w = VL / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) t[i] += t[i + w];
  return t[0];
}

// vsum of VL vectors at once: lane p of the result is vsum(v[p]), bit for bit (the same pairwise
// tree, level by level), in about 3 vector operations per vector instead of vsum's ~VL scalar
// ones. Each level pairs vectors whose keys' partial sums lie in segments of L lanes into one
// whose segments are L / 2 lanes long: segment lane j takes lanes j and j + L / 2 of its key's
// old segment, as vsum's level adds t[j + w] to t[j]. Keys stay in order; `v` is overwritten.
template <int L>
inline void vsum_lanes_level(vf* v, int n) {
  if constexpr (L > 1) {
    constexpr int K = VL / L;  // keys per input vector
    vi lo, hi;
    for (int s = 0; s < 2 * K; ++s)
      for (int j = 0; j < L / 2; ++j) {
        const int src = s < K ? s * L + j : VL + (s - K) * L + j;
        lo[s * (L / 2) + j] = src;
        hi[s * (L / 2) + j] = src + L / 2;
      }
    for (int i = 0; i < n / 2; ++i) {
      const vf a = v[2 * i], b = v[2 * i + 1];
      v[i] = __builtin_shuffle(a, b, lo) + __builtin_shuffle(a, b, hi);
    }
    vsum_lanes_level<L / 2>(v, n / 2);
  }
}

inline vf vsum_lanes(vf (&v)[VL]) {
  vsum_lanes_level<VL>(v, VL);
  return v[0];
}

inline vf vmax(vf a, vf b) { return a > b ? a : b; }

// exp(x) for x <= 0 (softmax after max subtraction): Cody-Waite range reduction and a degree-6
// polynomial, relative error ~2e-7; inputs below -87 give 0.
inline vf vexp_nonpos(vf x) {
  const vf lo = vbroadcast(-87.0f);
  vf xc = x < lo ? lo : x;
  vf t = xc * 1.44269504088896341f + 12582912.0f;  // round to nearest via the 1.5 * 2^23 trick
  vf n = t - 12582912.0f;
  vf r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  vf p = vbroadcast(1.9875691500e-4f);
  p = vfma(p, r, vbroadcast(1.3981999507e-3f));
  p = vfma(p, r, vbroadcast(8.3334519073e-3f));
  p = vfma(p, r, vbroadcast(4.1665795894e-2f));
  p = vfma(p, r, vbroadcast(1.6666665459e-1f));
  p = vfma(p, r, vbroadcast(5.0000001201e-1f));
  p = p * r * r + r + 1.0f;
  vi e = (__builtin_convertvector(n, vi) + 127) << 23;
  vf scale;
  std::memcpy(&scale, &e, sizeof(scale));
  vf out = p * scale;
  return x < lo ? vf{} : out;
}

// Natural log for positive normal x (Cephes' logf: mantissa in [sqrt(1/2), sqrt(2)), a
// degree-9 polynomial), relative error ~1e-7.
inline vf vlog_pos(vf x) {
  vi bits;
  std::memcpy(&bits, &x, sizeof(bits));
  vi e = ((bits >> 23) & 0xff) - 126;
  bits = (bits & 0x007fffff) | 0x3f000000;  // mantissa in [0.5, 1)
  vf m;
  std::memcpy(&m, &bits, sizeof(m));
  vi small = m < 0.707106781186547524f;
  vf ef = __builtin_convertvector(e + small, vf);  // small is -1 where true
  m = m + (small ? m : vf{}) - 1.0f;
  vf z = m * m;
  vf y = vbroadcast(7.0376836292e-2f);
  y = vfma(y, m, vbroadcast(-1.1514610310e-1f));
  y = vfma(y, m, vbroadcast(1.1676998740e-1f));
  y = vfma(y, m, vbroadcast(-1.2420140846e-1f));
  y = vfma(y, m, vbroadcast(1.4249322787e-1f));
  y = vfma(y, m, vbroadcast(-1.6668057665e-1f));
  y = vfma(y, m, vbroadcast(2.0000714765e-1f));
  y = vfma(y, m, vbroadcast(-2.4999993993e-1f));
  y = vfma(y, m, vbroadcast(3.3333331174e-1f));
  y = y * m * z;
  y = y + ef * -2.12194440e-4f - 0.5f * z;
  return m + y + ef * 0.693359375f;
}

}  // namespace tierserve
