// Weight-only quantized GEMM with float32 activations: out[M, N] (+)= a[M, K] @ W[K, N] (+ bias),
// W held in the GGUF file's own block formats (32 weights per block along K):
//
//   Q8  (q8_0):        w = d * q,      q int8,  d fp16 per (block, column)
//   Q4  (q4_0, q4_1):  w = d * q + m,  q 0..15, d and m fp16 per (block, column); q4_0 has
//                      m = -8 d (exactly: a power-of-two multiple of an fp16 value)
//
// Layout (`tierserve.model.quant` packs it at load): the weight is stored K-major like the
// float32 kernel's `[K, N]`, so that a column tile reads consecutive bytes of each k row:
//
//   Q8: q [K, N] int8;           d [K/32, N] fp16
//   Q4: q [K/2, N] uint8, byte row 16 b + j holds k = 32 b + j (low nibble) and
//       k = 32 b + 16 + j (high nibble), as GGUF pairs them;  d, m [K/32, N] fp16
//
// Each weight vector is dequantized in registers (w = fma(q, d, m)) and multiplied into an
// MR x NV block of accumulators, one FMA chain per output in a fixed k order (for Q4: k0, k0 + 16,
// k0 + 1, k0 + 17, ...). With more rows than one register block, each thread first dequantizes
// its column tile for the whole K into a float panel in that same order and runs the row blocks
// over it: the same values in the same order, so a row's result does not depend on the batch.
#include <ATen/core/Tensor.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "qweight.h"
#include "vec.h"
#include "parallel.h"

namespace tierserve {
namespace {

constexpr int64_t kBlock = 32;
constexpr int kPrefetch = 8;

#if defined(__AVX512F__)
inline vf load_i8(const int8_t* p) {
  return (vf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}
inline void load_u4(const uint8_t* p, vf& lo, vf& hi) {
  __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
  lo = (vf)_mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)));
  hi = (vf)_mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
}
inline vf load_f16(const uint16_t* p) {
  return (vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
}
#elif defined(__AVX2__) && defined(__F16C__)
inline vf load_i8(const int8_t* p) {
  return (vf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}
inline void load_u4(const uint8_t* p, vf& lo, vf& hi) {
  __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
  lo = (vf)_mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15)));
  hi = (vf)_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
}
inline vf load_f16(const uint16_t* p) {
  return (vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
}
#else
inline vf load_i8(const int8_t* p) {
  vf r;
  for (int i = 0; i < VL; ++i) r[i] = static_cast<float>(p[i]);
  return r;
}
inline void load_u4(const uint8_t* p, vf& lo, vf& hi) {
  for (int i = 0; i < VL; ++i) {
    lo[i] = static_cast<float>(p[i] & 15);
    hi[i] = static_cast<float>(p[i] >> 4);
  }
}
inline vf load_f16(const uint16_t* p) {
  vf r;
  for (int i = 0; i < VL; ++i) r[i] = half_to_float(p[i]);
  return r;
}
#endif

// The k index of panel row r (the order every path sums in).
inline int64_t k_of_row(int fmt, int64_t r) {
  if (fmt == kQ8) return r;
  const int64_t b = r / kBlock, i = r % kBlock;
  return b * kBlock + i / 2 + (i % 2) * (kBlock / 2);
}

template <int MR, int NV>
inline void init_acc(vf (&acc)[MR][NV], const float* c, int64_t ldc, const float* bias,
                     bool accumulate) {
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v) {
      vf init = accumulate ? vload(c + m * ldc + v * VL) : vf{};
      acc[m][v] = bias ? init + vload(bias + v * VL) : init;
    }
}

template <int MR, int NV>
inline void store_acc(vf (&acc)[MR][NV], float* c, int64_t ldc) {
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v) vstore(c + m * ldc + v * VL, acc[m][v]);
}

// Dequantize in registers: columns [n0, n0 + NV * VL) of MR rows.
template <int FMT, int MR, int NV>
void qtile(const float* a, int64_t lda, const QView& w, int64_t n0, float* c, int64_t ldc,
           const float* bias, bool accumulate) {
  vf acc[MR][NV];
  init_acc<MR, NV>(acc, c, ldc, bias, accumulate);
  const int64_t N = w.N;
  for (int64_t b = 0; b < w.K / kBlock; ++b) {
    vf d[NV], mn[NV];
    for (int v = 0; v < NV; ++v) {
      d[v] = load_f16(w.d + b * N + n0 + v * VL);
      if (FMT == kQ4) mn[v] = load_f16(w.m + b * N + n0 + v * VL);
    }
    const float* ab = a + b * kBlock;
    if constexpr (FMT == kQ8) {
      const int8_t* qb = static_cast<const int8_t*>(w.q) + b * kBlock * N + n0;
      for (int j = 0; j < kBlock; ++j) {
        const int8_t* qk = qb + j * N;
        __builtin_prefetch(qk + kPrefetch * N, 0, 0);
        vf wv[NV];
        for (int v = 0; v < NV; ++v) wv[v] = load_i8(qk + v * VL) * d[v];
        for (int m = 0; m < MR; ++m) {
          vf x = vbroadcast(ab[m * lda + j]);
          for (int v = 0; v < NV; ++v) acc[m][v] = vfma(x, wv[v], acc[m][v]);
        }
      }
    } else {
      const uint8_t* qb = static_cast<const uint8_t*>(w.q) + b * (kBlock / 2) * N + n0;
      for (int j = 0; j < kBlock / 2; ++j) {
        const uint8_t* qk = qb + j * N;
        __builtin_prefetch(qk + kPrefetch * N, 0, 0);
        vf lo[NV], hi[NV];
        for (int v = 0; v < NV; ++v) {
          load_u4(qk + v * VL, lo[v], hi[v]);
          lo[v] = vfma(lo[v], d[v], mn[v]);
          hi[v] = vfma(hi[v], d[v], mn[v]);
        }
        for (int m = 0; m < MR; ++m) {
          vf xl = vbroadcast(ab[m * lda + j]), xh = vbroadcast(ab[m * lda + j + kBlock / 2]);
          for (int v = 0; v < NV; ++v) {
            acc[m][v] = vfma(xl, lo[v], acc[m][v]);
            acc[m][v] = vfma(xh, hi[v], acc[m][v]);
          }
        }
      }
    }
  }
  store_acc<MR, NV>(acc, c, ldc);
}

// Columns [n0, n0 + NV * VL) dequantized for every k into `panel` ([K, NV * VL] floats, rows in
// summation order).
template <int FMT, int NV>
void dequant_panel(const QView& w, int64_t n0, float* panel) {
  constexpr int64_t NR = NV * VL;
  const int64_t N = w.N;
  for (int64_t b = 0; b < w.K / kBlock; ++b) {
    vf d[NV], mn[NV];
    for (int v = 0; v < NV; ++v) {
      d[v] = load_f16(w.d + b * N + n0 + v * VL);
      if (FMT == kQ4) mn[v] = load_f16(w.m + b * N + n0 + v * VL);
    }
    float* pb = panel + b * kBlock * NR;
    if constexpr (FMT == kQ8) {
      const int8_t* qb = static_cast<const int8_t*>(w.q) + b * kBlock * N + n0;
      for (int j = 0; j < kBlock; ++j)
        for (int v = 0; v < NV; ++v) vstore(pb + j * NR + v * VL, load_i8(qb + j * N + v * VL) * d[v]);
    } else {
      const uint8_t* qb = static_cast<const uint8_t*>(w.q) + b * (kBlock / 2) * N + n0;
      for (int j = 0; j < kBlock / 2; ++j)
        for (int v = 0; v < NV; ++v) {
          vf lo, hi;
          load_u4(qb + j * N + v * VL, lo, hi);
          vstore(pb + (2 * j) * NR + v * VL, vfma(lo, d[v], mn[v]));
          vstore(pb + (2 * j + 1) * NR + v * VL, vfma(hi, d[v], mn[v]));
        }
    }
  }
}

// MR rows against a dequantized panel, in the panel's k order.
template <int FMT, int MR, int NV>
void ptile(const float* a, int64_t lda, const float* panel, int64_t K, float* c, int64_t ldc,
           const float* bias, bool accumulate) {
  constexpr int64_t NR = NV * VL;
  vf acc[MR][NV];
  init_acc<MR, NV>(acc, c, ldc, bias, accumulate);
  for (int64_t b = 0; b < K / kBlock; ++b) {
    const float* ab = a + b * kBlock;
    const float* pb = panel + b * kBlock * NR;
    for (int j = 0; j < kBlock; ++j) {
      const int64_t k = FMT == kQ8 ? j : j / 2 + (j % 2) * (kBlock / 2);
      vf wv[NV];
      for (int v = 0; v < NV; ++v) wv[v] = vload(pb + j * NR + v * VL);
      for (int m = 0; m < MR; ++m) {
        vf x = vbroadcast(ab[m * lda + k]);
        for (int v = 0; v < NV; ++v) acc[m][v] = vfma(x, wv[v], acc[m][v]);
      }
    }
  }
  store_acc<MR, NV>(acc, c, ldc);
}

#if defined(__AVX512F__)
constexpr int kMR = 6;
#else
constexpr int kMR = 4;
#endif
constexpr int kNV = VL >= 16 ? 2 : 2;  // columns per register tile, in vectors

// Scalar reference for columns that do not fill a vector (odd N).
void tail_columns(const float* a, int64_t lda, const QView& w, int64_t M, int64_t n0, int64_t n1,
                  float* c, int64_t ldc, const float* bias, bool accumulate) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      float s = accumulate ? c[m * ldc + n] : 0.f;
      if (bias) s += bias[n];
      for (int64_t r = 0; r < w.K; ++r)
        s = std::fma(a[m * lda + k_of_row(w.fmt, r)], w.value(r, n), s);
      c[m * ldc + n] = s;
    }
}

template <int FMT, int NV>
void rows_direct(const float* a, int64_t lda, const QView& w, int64_t M, int64_t n0, float* c,
                 int64_t ldc, const float* bias, bool accumulate) {
  int64_t m = 0;
  for (; m + kMR <= M; m += kMR)
    qtile<FMT, kMR, NV>(a + m * lda, lda, w, n0, c + m * ldc + n0, ldc, bias, accumulate);
  const float* am = a + m * lda;
  float* cm = c + m * ldc + n0;
  switch (M - m) {
    case 1: qtile<FMT, 1, NV>(am, lda, w, n0, cm, ldc, bias, accumulate); break;
    case 2: qtile<FMT, 2, NV>(am, lda, w, n0, cm, ldc, bias, accumulate); break;
    case 3: qtile<FMT, 3, NV>(am, lda, w, n0, cm, ldc, bias, accumulate); break;
#if defined(__AVX512F__)
    case 4: qtile<FMT, 4, NV>(am, lda, w, n0, cm, ldc, bias, accumulate); break;
    case 5: qtile<FMT, 5, NV>(am, lda, w, n0, cm, ldc, bias, accumulate); break;
#endif
    default: break;
  }
}

template <int FMT, int NV>
void rows_panel(const float* a, int64_t lda, const float* panel, int64_t K, int64_t M, float* c,
                int64_t ldc, const float* bias, bool accumulate) {
  int64_t m = 0;
  for (; m + kMR <= M; m += kMR)
    ptile<FMT, kMR, NV>(a + m * lda, lda, panel, K, c + m * ldc, ldc, bias, accumulate);
  const float* am = a + m * lda;
  float* cm = c + m * ldc;
  switch (M - m) {
    case 1: ptile<FMT, 1, NV>(am, lda, panel, K, cm, ldc, bias, accumulate); break;
    case 2: ptile<FMT, 2, NV>(am, lda, panel, K, cm, ldc, bias, accumulate); break;
    case 3: ptile<FMT, 3, NV>(am, lda, panel, K, cm, ldc, bias, accumulate); break;
#if defined(__AVX512F__)
    case 4: ptile<FMT, 4, NV>(am, lda, panel, K, cm, ldc, bias, accumulate); break;
    case 5: ptile<FMT, 5, NV>(am, lda, panel, K, cm, ldc, bias, accumulate); break;
#endif
    default: break;
  }
}

// One row: each thread streams one contiguous slice of the columns in wide tiles.
template <int FMT, int NV>
void wide_part(const float* a, const QView& w, int64_t v0, int64_t v1, float* c, const float* bias,
               bool accumulate) {
  for (; v0 + NV <= v1; v0 += NV) {
    const int64_t n0 = v0 * VL;
    qtile<FMT, 1, NV>(a, 0, w, n0, c + n0, 0, bias ? bias + n0 : nullptr, accumulate);
  }
  if constexpr (NV > 1) wide_part<FMT, NV / 2>(a, w, v0, v1, c, bias, accumulate);
}

template <int FMT>
void run(const float* a, int64_t lda, const QView& w, int64_t M, float* c, const float* bias,
         bool accumulate, int64_t panel_min_rows) {
  const int64_t N = w.N, vectors = N / VL;
  if (M == 1) {
    constexpr int kWide = VL >= 16 ? 8 : 4;
    const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(4 * kernel_threads(), vectors));
    claim_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        wide_part<FMT, kWide>(a, w, vectors * p / parts, vectors * (p + 1) / parts, c, bias,
                              accumulate);
        if (p == parts - 1 && vectors * VL < N)
          tail_columns(a, lda, w, 1, vectors * VL, N, c, N, bias, accumulate);
      }
    });
    return;
  }
  constexpr int64_t NR = kNV * VL;
  const int64_t tiles = N / NR;
  const bool panel = M >= panel_min_rows;
  claim_for(0, tiles + 1, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> buf;
    if (panel) buf.resize(static_cast<size_t>(w.K * NR));
    for (int64_t t = t0; t < t1; ++t) {
      if (t == tiles) {
        if (tiles * NR < N) tail_columns(a, lda, w, M, tiles * NR, N, c, N, bias, accumulate);
        continue;
      }
      const int64_t n0 = t * NR;
      const float* bt = bias ? bias + n0 : nullptr;
      if (panel) {
        dequant_panel<FMT, kNV>(w, n0, buf.data());
        rows_panel<FMT, kNV>(a, lda, buf.data(), w.K, M, c + n0, N, bt, accumulate);
      } else {
        rows_direct<FMT, kNV>(a, lda, w, M, n0, c, N, bt, accumulate);
      }
    }
  });
}


#if defined(__AVX512BF16__)
// bf16 products, float32 sums (a weight made with `bf16=True`), at every row count so that a row's
// result still does not depend on its batch: the panel holds each weight
// pair of the summation order (Q4: the two nibbles of a byte, k0 + j and k0 + 16 + j; Q8: k and
// k + 1) as two bf16 in one 32-bit lane, the activations are converted to the same pairs once
// per call, and `vdpbf16ps` adds both products of a pair into a float32 accumulator: twice the
// multiply-adds of an fp32 FMA per instruction, at bf16's 8-bit mantissa on both operands.
constexpr int kNVb = 4;  // 64 columns per tile: 6 x 4 accumulators + 4 weight vectors

inline uint32_t bf16_bits(float f) {  // round to nearest even (no NaNs here)
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return (u + 0x7fff + ((u >> 16) & 1)) >> 16;
}

// Columns that do not fill a tile (odd N), in the same pair order and bf16 rounding, scalar.
inline float bf16_value(uint32_t bits16) {
  const uint32_t u = bits16 << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

template <int FMT>
void pair_activations(const float* a, int64_t lda, int64_t M, int64_t K, uint32_t* xp) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t p = 0; p < K / 2; ++p) {
      const int64_t b = p / 16, j = p % 16;
      const int64_t k1 = FMT == kQ8 ? b * kBlock + 2 * j : b * kBlock + j;
      const int64_t k2 = FMT == kQ8 ? k1 + 1 : k1 + kBlock / 2;
      xp[m * (K / 2) + p] = bf16_bits(a[m * lda + k1]) | (bf16_bits(a[m * lda + k2]) << 16);
    }
}

// The bf16 pairs of `j`-th pair row of block b, columns n0 + v * VL ... (16 lanes).
template <int FMT>
inline __m512i bf16_pairs(const QView& w, int64_t b, int j, int64_t col, vf d, vf mn) {
  alignas(64) static const uint16_t kIdx[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21,
                                                6, 22, 7, 23, 8, 24, 9, 25, 10, 26, 11, 27,
                                                12, 28, 13, 29, 14, 30, 15, 31};
  const int64_t N = w.N;
  vf first, second;
  if constexpr (FMT == kQ8) {
    const int8_t* q = static_cast<const int8_t*>(w.q) + (b * kBlock + 2 * j) * N + col;
    first = load_i8(q) * d;
    second = load_i8(q + N) * d;
  } else {
    const uint8_t* q = static_cast<const uint8_t*>(w.q) + (b * 16 + j) * N + col;
    load_u4(q, first, second);
    first = first * d + mn;
    second = second * d + mn;
  }
  __m512bh pk = _mm512_cvtne2ps_pbh((__m512)second, (__m512)first);
  return _mm512_permutexvar_epi16(_mm512_load_si512(kIdx), (__m512i)pk);
}

template <int FMT>
void tail_columns_bf16(const uint32_t* xp, int64_t K2, const QView& w, int64_t M, int64_t n0,
                       int64_t n1, float* c, const float* bias, bool accumulate) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      float s = accumulate ? c[m * w.N + n] : 0.f;
      if (bias) s += bias[n];
      for (int64_t p = 0; p < K2; ++p) {
        const int64_t b = p / 16, j = p % 16;
        const int64_t r1 = FMT == kQ8 ? b * kBlock + 2 * j : b * kBlock + 2 * j;  // panel rows
        const float w1 = bf16_value(bf16_bits(w.value(r1, n)));
        const float w2 = bf16_value(bf16_bits(w.value(r1 + 1, n)));
        const uint32_t x = xp[m * K2 + p];
        s += bf16_value(x & 0xffff) * w1 + bf16_value(x >> 16) * w2;
      }
      c[m * w.N + n] = s;
    }
}

template <int FMT>
void dequant_panel_bf16(const QView& w, int64_t n0, uint32_t* panel) {
  constexpr int64_t NR = kNVb * VL;
  const int64_t N = w.N;
  for (int64_t b = 0; b < w.K / kBlock; ++b)
    for (int v = 0; v < kNVb; ++v) {
      const int64_t col = n0 + v * VL;
      const vf d = load_f16(w.d + b * N + col);
      const vf mn = FMT == kQ4 ? load_f16(w.m + b * N + col) : vf{};
      for (int j = 0; j < 16; ++j)
        _mm512_storeu_si512(panel + (b * 16 + j) * NR + v * VL, bf16_pairs<FMT>(w, b, j, col, d, mn));
    }
}

// Few rows: the pairs are made in registers, in the panel's order (same values, same sums).
template <int FMT, int MR, int NV>
void qtile_bf16(const uint32_t* xp, int64_t K2, const QView& w, int64_t n0, float* c,
                int64_t ldc, const float* bias, bool accumulate) {
  vf acc[MR][NV];
  init_acc<MR, NV>(acc, c, ldc, bias, accumulate);
  const int64_t N = w.N;
  for (int64_t b = 0; b < w.K / kBlock; ++b) {
    vf d[NV], mn[NV];
    for (int v = 0; v < NV; ++v) {
      d[v] = load_f16(w.d + b * N + n0 + v * VL);
      mn[v] = FMT == kQ4 ? load_f16(w.m + b * N + n0 + v * VL) : vf{};
    }
    for (int j = 0; j < 16; ++j) {
      if constexpr (FMT == kQ8)
        __builtin_prefetch(static_cast<const int8_t*>(w.q) + (b * kBlock + 2 * j + kPrefetch) * N + n0, 0, 0);
      else
        __builtin_prefetch(static_cast<const uint8_t*>(w.q) + (b * 16 + j + kPrefetch) * N + n0, 0, 0);
      __m512i wv[NV];
      for (int v = 0; v < NV; ++v) wv[v] = bf16_pairs<FMT>(w, b, j, n0 + v * VL, d[v], mn[v]);
      for (int m = 0; m < MR; ++m) {
        const __m512i x = _mm512_set1_epi32(static_cast<int>(xp[m * K2 + b * 16 + j]));
        for (int v = 0; v < NV; ++v)
          acc[m][v] = (vf)_mm512_dpbf16_ps((__m512)acc[m][v], (__m512bh)x, (__m512bh)wv[v]);
      }
    }
  }
  store_acc<MR, NV>(acc, c, ldc);
}

template <int FMT, int NV>
void wide_part_bf16(const uint32_t* xp, int64_t K2, const QView& w, int64_t v0, int64_t v1,
                    float* c, const float* bias, bool accumulate) {
  for (; v0 + NV <= v1; v0 += NV) {
    const int64_t n0 = v0 * VL;
    qtile_bf16<FMT, 1, NV>(xp, K2, w, n0, c + n0, 0, bias ? bias + n0 : nullptr, accumulate);
  }
  if constexpr (NV > 1) wide_part_bf16<FMT, NV / 2>(xp, K2, w, v0, v1, c, bias, accumulate);
}

template <int MR>
void ptile_bf16(const uint32_t* xp, int64_t K2, const uint32_t* panel, float* c, int64_t ldc,
                const float* bias, bool accumulate) {
  constexpr int64_t NR = kNVb * VL;
  vf acc[MR][kNVb];
  init_acc<MR, kNVb>(acc, c, ldc, bias, accumulate);
  for (int64_t p = 0; p < K2; ++p) {
    __m512i wv[kNVb];
    for (int v = 0; v < kNVb; ++v) wv[v] = _mm512_loadu_si512(panel + p * NR + v * VL);
    for (int m = 0; m < MR; ++m) {
      const __m512i x = _mm512_set1_epi32(static_cast<int>(xp[m * K2 + p]));
      for (int v = 0; v < kNVb; ++v)
        acc[m][v] = (vf)_mm512_dpbf16_ps((__m512)acc[m][v], (__m512bh)x, (__m512bh)wv[v]);
    }
  }
  store_acc<MR, kNVb>(acc, c, ldc);
}

template <int FMT>
void run_bf16(const float* a, int64_t lda, const QView& w, int64_t M, float* c, const float* bias,
              bool accumulate, int64_t panel_min_rows) {
  const int64_t N = w.N, K2 = w.K / 2, vectors = N / VL;
  std::vector<uint32_t> xp(static_cast<size_t>(M * K2));
  pair_activations<FMT>(a, lda, M, w.K, xp.data());
  if (M == 1) {
    const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(4 * kernel_threads(), vectors));
    claim_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        wide_part_bf16<FMT, 8>(xp.data(), K2, w, vectors * p / parts, vectors * (p + 1) / parts,
                               c, bias, accumulate);
        if (p == parts - 1 && vectors * VL < N)
          tail_columns_bf16<FMT>(xp.data(), K2, w, 1, vectors * VL, N, c, bias, accumulate);
      }
    });
    return;
  }
  constexpr int64_t NR = kNVb * VL;
  const int64_t tiles = N / NR;
  const bool use_panel = M >= panel_min_rows;
  claim_for(0, tiles + 1, 1, [&](int64_t t0, int64_t t1) {
    std::vector<uint32_t> panel;
    for (int64_t t = t0; t < t1; ++t) {
      if (t == tiles) {
        if (tiles * NR < N) tail_columns_bf16<FMT>(xp.data(), K2, w, M, tiles * NR, N, c, bias, accumulate);
        continue;
      }
      const int64_t n0 = t * NR;
      const float* bt = bias ? bias + n0 : nullptr;
      if (use_panel) {
        panel.resize(static_cast<size_t>(K2 * NR));
        dequant_panel_bf16<FMT>(w, n0, panel.data());
      }
      int64_t m = 0;
      for (; m + kMR <= M; m += kMR) {
        if (use_panel)
          ptile_bf16<kMR>(xp.data() + m * K2, K2, panel.data(), c + m * N + n0, N, bt, accumulate);
        else
          qtile_bf16<FMT, kMR, kNVb>(xp.data() + m * K2, K2, w, n0, c + m * N + n0, N, bt, accumulate);
      }
      const uint32_t* xm = xp.data() + m * K2;
      float* cm = c + m * N + n0;
      switch (M - m) {
#define TS_ROWS(r)                                                             \
  case r:                                                                      \
    if (use_panel)                                                             \
      ptile_bf16<r>(xm, K2, panel.data(), cm, N, bt, accumulate);              \
    else                                                                       \
      qtile_bf16<FMT, r, kNVb>(xm, K2, w, n0, cm, N, bt, accumulate);          \
    break;
        TS_ROWS(1) TS_ROWS(2) TS_ROWS(3) TS_ROWS(4) TS_ROWS(5)
#undef TS_ROWS
        default: break;
      }
    }
  });
}
#endif

}  // namespace

float QView::value(int64_t r, int64_t n) const {
  if (q == nullptr) return value_i8(*this, k_of_row(fmt, r), n);
  const int64_t b = r / kBlock;
  const float dv = half_to_float(d[b * N + n]);
  if (fmt == kQ8) return dv * static_cast<float>(static_cast<const int8_t*>(q)[r * N + n]);
  const int64_t i = r % kBlock;
  const uint8_t byte = static_cast<const uint8_t*>(q)[(b * (kBlock / 2) + i / 2) * N + n];
  const float qv = static_cast<float>(i % 2 ? byte >> 4 : byte & 15);
  return std::fma(qv, dv, half_to_float(m[b * N + n]));  // as the vector path's vfma
}

QView QWeight::view() const {
  QView v;
  v.fmt = static_cast<int>(fmt);
  v.K = K;
  v.N = N;
  v.q = q.defined() ? q.data_ptr() : nullptr;
  v.d = d.defined() ? reinterpret_cast<const uint16_t*>(d.data_ptr()) : nullptr;
  v.m = fmt == kQ4 && m.defined() ? reinterpret_cast<const uint16_t*>(m.data_ptr()) : nullptr;
  v.bf16 = bf16;
  v.int8 = int8;
  v.i8 = i8.defined() ? i8.data_ptr() : nullptr;
  return v;
}

QWeight::QWeight(int64_t fmt_, at::Tensor q_, c10::optional<at::Tensor> d_,
                 c10::optional<at::Tensor> m_, bool bf16_, bool int8_)
    : fmt(fmt_),
      q(std::move(q_)),
      bf16(bf16_ && !int8_ && fmt_ != kF32 && bf16_available()),
      int8(int8_ && fmt_ != kF32 && int8_available()) {
  TORCH_CHECK(fmt == kF32 || fmt == kQ8 || fmt == kQ4,
              "QWeight: format must be 0 (f32), 1 (q8) or 2 (q4), got ", fmt);
  if (fmt == kF32) {
    TORCH_CHECK(q.dim() == 2 && q.is_contiguous() && q.scalar_type() == at::kFloat,
                "QWeight: a float32 weight must be a contiguous [K, N] tensor");
    K = q.size(0);
    N = q.size(1);
    return;
  }
  TORCH_CHECK(d_.has_value(), "QWeight: quantized weights need scales");
  d = *d_;
  TORCH_CHECK(q.dim() == 2 && d.dim() == 2 && q.is_contiguous() && d.is_contiguous(),
              "QWeight: contiguous 2-D q and d expected");
  TORCH_CHECK(d.scalar_type() == at::kHalf, "QWeight: fp16 scales expected");
  N = q.size(1);
  K = fmt == kQ8 ? q.size(0) : 2 * q.size(0);
  TORCH_CHECK(K % kBlock == 0 && d.size(0) == K / kBlock && d.size(1) == N,
              "QWeight: K must be a multiple of 32 and d [K/32, N]");
  if (fmt == kQ8) {
    TORCH_CHECK(q.scalar_type() == at::kChar, "QWeight: q8 weights must be int8");
  } else {
    TORCH_CHECK(q.scalar_type() == at::kByte, "QWeight: q4 weights must be uint8");
    TORCH_CHECK(m_.has_value() && m_->sizes() == d.sizes() && m_->is_contiguous() &&
                    m_->scalar_type() == at::kHalf,
                "QWeight: q4 needs fp16 mins shaped like d");
    m = *m_;
  }
  if (int8) {
    i8 = repack_i8(view());
    if (N % 64 == 0) {  // no tail columns: nothing reads the GGUF layout any more
      q = at::Tensor();
      d = at::Tensor();
      m = at::Tensor();
      released = true;
    }
  }
}

int64_t QWeight::panel_min_rows = 7;
bool QWeight::int8_available() { return int8_products_available(); }
bool QWeight::bf16_available() {
#if defined(__AVX512BF16__)
  return true;
#else
  return false;
#endif
}

void qlinear_raw(const float* a, int64_t lda, const QView& w, int64_t M, float* out,
                 const float* bias, bool accumulate) {
  if (M == 0) return;
  if (w.int8) return qlinear_i8(a, lda, w, M, out, bias, accumulate);
#if defined(__AVX512BF16__)
  if (w.bf16) {
    if (w.fmt == kQ8)
      run_bf16<kQ8>(a, lda, w, M, out, bias, accumulate, QWeight::panel_min_rows);
    else
      run_bf16<kQ4>(a, lda, w, M, out, bias, accumulate, QWeight::panel_min_rows);
    return;
  }
#endif
  if (w.fmt == kQ8)
    run<kQ8>(a, lda, w, M, out, bias, accumulate, QWeight::panel_min_rows);
  else
    run<kQ4>(a, lda, w, M, out, bias, accumulate, QWeight::panel_min_rows);
}

// out = a @ W (+ bias), or out += a @ W (+ bias) with accumulate.
void linear_into(const at::Tensor& a, const at::Tensor& w_t, const c10::optional<at::Tensor>& bias,
                 at::Tensor& out, bool accumulate);

void weight_linear_into(const at::Tensor& a, const QWeight& w, const c10::optional<at::Tensor>& bias,
                        at::Tensor& out, bool accumulate) {
  if (w.fmt == kF32) return linear_into(a, w.q, bias, out, accumulate);
  TORCH_CHECK(a.dim() == 2 && out.dim() == 2 && a.scalar_type() == at::kFloat &&
                  out.scalar_type() == at::kFloat,
              "qlinear: float32 2-D input and out expected");
  TORCH_CHECK(a.stride(1) == 1 && out.is_contiguous(), "qlinear: contiguous rows expected");
  TORCH_CHECK(a.size(1) == w.K, "qlinear: input has ", a.size(1), " columns, weight K ", w.K);
  TORCH_CHECK(out.size(0) == a.size(0) && out.size(1) == w.N, "qlinear: out has the wrong shape");
  const float* b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == w.N && bias->scalar_type() == at::kFloat,
                "qlinear: bias must be float32 [N]");
    b = bias->data_ptr<float>();
  }
  qlinear_raw(a.data_ptr<float>(), a.stride(0), w.view(), a.size(0), out.data_ptr<float>(), b,
              accumulate);
}

// The weight as float32 [K, N] in true k order, into `out` (the BLAS path for long prompts and
// the tests), through the same dequantizing code as the kernel's panels.
void qweight_dequantize_into(const QWeight& w, at::Tensor& out) {
  TORCH_CHECK(w.fmt != kF32, "dequantize: the weight is float32 already");
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.dim() == 2 &&
                  out.size(0) == w.K && out.size(1) == w.N,
              "dequantize: out must be float32 [K, N]");
  const QView v = w.view();
  float* o = out.data_ptr<float>();
  if (v.q == nullptr) return dequantize_i8(v, o);  // only the int8 repack is left
  constexpr int64_t NR = kNV * VL;
  const int64_t tiles = w.N / NR;
  claim_for(0, tiles + 1, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> buf(static_cast<size_t>(w.K * NR));
    for (int64_t t = t0; t < t1; ++t) {
      if (t == tiles) {
        for (int64_t r = 0; r < w.K; ++r)
          for (int64_t n = tiles * NR; n < w.N; ++n) o[k_of_row(v.fmt, r) * w.N + n] = v.value(r, n);
        continue;
      }
      if (v.fmt == kQ8)
        dequant_panel<kQ8, kNV>(v, t * NR, buf.data());
      else
        dequant_panel<kQ4, kNV>(v, t * NR, buf.data());
      for (int64_t r = 0; r < w.K; ++r)
        std::memcpy(o + k_of_row(v.fmt, r) * w.N + t * NR, buf.data() + r * NR, NR * sizeof(float));
    }
  });
}

// Columns `ids` of W as rows: out[i, k] = W[k, ids[i]] (a tied embedding's lookup), from
// whichever layout the weight holds.
void qweight_columns_into(const QWeight& w, const at::Tensor& ids, at::Tensor& out) {
  TORCH_CHECK(w.fmt != kF32, "columns: the weight is float32");
  TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong && ids.is_contiguous(),
              "columns: ids must be a contiguous int64 vector");
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.dim() == 2 &&
                  out.size(0) == ids.size(0) && out.size(1) == w.K,
              "columns: out must be float32 [len(ids), K]");
  const QView v = w.view();
  const int64_t* id = ids.data_ptr<int64_t>();
  float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < ids.size(0); ++i)
    TORCH_CHECK(id[i] >= 0 && id[i] < w.N, "columns: id ", id[i], " outside 0..", w.N - 1);
  claim_for(0, ids.size(0), 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t r = 0; r < w.K; ++r) o[i * w.K + k_of_row(v.fmt, r)] = v.value(r, id[i]);
  });
}

}  // namespace tierserve
