// Portable SIMD through GCC vector extensions: one `vf` is the widest float vector the build
// machine has (-march=native): 16 lanes with AVX-512, 8 with AVX2/AVX, 4 otherwise. The compiler
// lowers `a * b + c` to FMA where the machine has it.
#pragma once

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

inline vf vload(const float* p) { return *reinterpret_cast<const vf_unaligned*>(p); }
inline void vstore(float* p, vf v) { *reinterpret_cast<vf_unaligned*>(p) = v; }
inline vf vbroadcast(float x) { return vf{} + x; }

// Horizontal sum as a fixed pairwise tree (log2(VL) dependent adds, not VL).
inline float vsum(vf v) {
  float t[VL];
  std::memcpy(t, &v, sizeof(t));
  for (int w = VL / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) t[i] += t[i + w];
  return t[0];
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
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  vi e = (__builtin_convertvector(n, vi) + 127) << 23;
  vf scale;
  std::memcpy(&scale, &e, sizeof(scale));
  vf out = p * scale;
  return x < lo ? vf{} : out;
}

}  // namespace tierserve
