// The KV cache's element types: float32, float16 or bfloat16 (`--kv-cache-dtype`).
//
// A 16-bit cache halves the bytes decode attention reads; its values are widened to float32
// as they are loaded (one instruction a vector: F16C's vcvtph2ps, or a 16-bit shift for
// bfloat16), so attention computes in float32 whatever the cache holds. Values are narrowed
// as they are written with round-to-nearest-even, exactly as torch's `.to(dtype)` rounds, so
// the kernels and the PyTorch backend store the same bits.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "vec.h"

namespace tierserve {

using KvHalf = c10::Half;
using KvBf16 = c10::BFloat16;

inline bool kv_dtype_supported(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

// VL consecutive cache values as float32.
inline vf kv_load(const float* p) { return vload(p); }

inline vf kv_load(const KvHalf* p) {
#if defined(__AVX512F__)
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return reinterpret_cast<vf>(_mm512_cvtph_ps(h));
#elif defined(__AVX__) && defined(__F16C__)
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return reinterpret_cast<vf>(_mm256_cvtph_ps(h));
#else
  vf v;
  for (int i = 0; i < VL; ++i) v[i] = static_cast<float>(p[i]);
  return v;
#endif
}

inline vf kv_load(const KvBf16* p) {
  // bfloat16 is the high half of a float32: zero-extend each to 32 bits and shift up.
#if defined(__AVX512F__)
  const __m512i w =
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return reinterpret_cast<vf>(_mm512_slli_epi32(w, 16));
#elif defined(__AVX2__)
  const __m256i w =
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return reinterpret_cast<vf>(_mm256_slli_epi32(w, 16));
#else
  vf v;
  for (int i = 0; i < VL; ++i) v[i] = static_cast<float>(p[i]);
  return v;
#endif
}

// dst[0, n) = src[0, n) narrowed to the cache's type (round to nearest even).
inline void kv_store(const float* src, float* dst, int64_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}

inline void kv_store(const float* src, KvHalf* dst, int64_t n) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(src + i), kRound));
#elif defined(__AVX__) && defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), kRound));
#endif
  for (; i < n; ++i) dst[i] = static_cast<KvHalf>(src[i]);
}

inline void kv_store(const float* src, KvBf16* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<KvBf16>(src[i]);  // c10's RNE
}

// Where key `u` of a cache block starts in the block's K tiles (attention.cpp's layout): its
// dimension d lies at k_offset(u, dim) + d * VL.
inline int64_t k_offset(int64_t u, int64_t dim) { return (u / VL) * dim * VL + u % VL; }

// One key's dim values into its K tile (narrowed as kv_store does): `block` is the block's
// start, `u` the key's index in the block.
template <class T>
inline void k_store(const float* src, T* block, int64_t u, int64_t dim) {
  T row[512];
  kv_store(src, row, dim);
  T* dst = block + k_offset(u, dim);
  for (int64_t d = 0; d < dim; ++d) dst[d * VL] = row[d];
}

}  // namespace tierserve
