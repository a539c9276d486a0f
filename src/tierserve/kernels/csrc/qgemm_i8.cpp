// Integer products for the GGUF block formats (a weight made with `int8=True`): each row of the
// activations is quantized per block of 32 to int8 (scale max|x| / 127, round to nearest, as
// llama.cpp's q8 activations), and the weights' 4- or 8-bit integers are multiplied into int32
// sums with AVX512_VNNI's `vpdpbusd` (64 multiply-adds per instruction) or, on CPUs with AVX2 and
// no AVX512_VNNI, with `vpmaddubsw` (32 multiply-adds into int16 pairs) and `vpmaddwd`; scaled to
// float once per block:
//
//   sum_k w x  ~  d_w d_x sum_k q xq  (+ m_w d_x sum_k xq   for q4, whose weights are d q + m)
//
// `vpdpbusd` multiplies unsigned by signed bytes: q4's nibbles are unsigned already; q8's signed
// weights get +128 (a sign-bit flip) and the sum -128 sum_k xq back, exactly. `vpmaddubsw`
// saturates its int16 pair sums, so AVX2 multiplies q8 as |q| by x with q's sign (at most
// 2 x 128 x 127 a pair), and sums a q4 block's 8 products (at most 15 x 127 x 16 = 30,480) in
// int16 before widening: both exact, so the two builds compute the same integer sums.
//
// The weight is repacked once at load into tiles of 64 columns whose blocks lie front to back
// (below), so that a step streams memory in order: qgemm.cpp's K-major rows are N bytes apart,
// which the hardware prefetchers and the TLB follow poorly at one row. Every row is quantized
// and summed alone in a fixed order, so a row's result does not depend on its batch.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "parallel.h"
#include "qweight.h"

namespace tierserve {

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define TS_I8_VNNI 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define TS_I8_AVX2 1
#endif

#if defined(TS_I8_VNNI) || defined(TS_I8_AVX2)
namespace {

constexpr int64_t kBlock = 32;
constexpr int64_t kCols = 64;                        // columns per tile
#if defined(TS_I8_VNNI)
constexpr int kMR = 3;                               // rows per register block
#else
constexpr int kMR = 4;
#endif

// Activations, quantized per row and block of 32.
struct QAct {
  int64_t M = 0, K = 0, nb = 0;
  std::vector<int8_t> q;     // [M, K]
  std::vector<float> d, s;   // [M, nb]: scale, sum of the block's quantized x (d sum xq)
  std::vector<int32_t> qs;   // [M, nb]: sum of the block's xq

  void resize(int64_t rows, int64_t k) {
    M = rows;
    K = k;
    nb = k / kBlock;
    q.resize(static_cast<size_t>(M * K));
    d.resize(static_cast<size_t>(M * nb));
    s.resize(static_cast<size_t>(M * nb));
    qs.resize(static_cast<size_t>(M * nb));
  }
};

#if defined(TS_I8_VNNI)
void quantize_rows(const float* a, int64_t lda, int64_t M, int64_t K, QAct& x) {
  x.resize(M, K);
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < x.nb; ++b) {
      const float* p = a + m * lda + b * kBlock;
      const __m512 v0 = _mm512_loadu_ps(p), v1 = _mm512_loadu_ps(p + 16);
      const float amax = _mm512_reduce_max_ps(
          _mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1)));
      const float d = amax / 127.0f;
      const __m512 id = _mm512_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
      const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, id));  // nearest, ties to even
      const __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, id));
      int8_t* qo = x.q.data() + m * K + b * kBlock;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qo), _mm512_cvtepi32_epi8(i0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qo + 16), _mm512_cvtepi32_epi8(i1));
      const int32_t qs = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
      x.d[m * x.nb + b] = d;
      x.s[m * x.nb + b] = d * static_cast<float>(qs);  // of the quantized x: q4's d q + m terms
      x.qs[m * x.nb + b] = qs;                          // then cancel as the weights' do
    }
}

#else
void quantize_rows(const float* a, int64_t lda, int64_t M, int64_t K, QAct& x) {
  x.resize(M, K);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undoes the packs' lanes
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < x.nb; ++b) {
      const float* p = a + m * lda + b * kBlock;
      __m256 v[4];
      for (int j = 0; j < 4; ++j) v[j] = _mm256_loadu_ps(p + 8 * j);
      const __m256 m8 = _mm256_max_ps(
          _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
          _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
      __m128 h = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
      h = _mm_max_ps(h, _mm_movehl_ps(h, h));
      h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
      const float amax = _mm_cvtss_f32(h);
      const float d = amax / 127.0f;
      const __m256 id = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
      __m256i i[4];
      for (int j = 0; j < 4; ++j) i[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], id));  // nearest
      const __m256i q8 = _mm256_permutevar8x32_epi32(
          _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3])),
          order);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(x.q.data() + m * K + b * kBlock), q8);
      const __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
      const int32_t qs = _mm_cvtsi128_si32(s4);
      x.d[m * x.nb + b] = d;
      x.s[m * x.nb + b] = d * static_cast<float>(qs);
      x.qs[m * x.nb + b] = qs;
    }
}

#endif

// The weight repacked at load (`repack_i8`), tile by tile of 64 columns, each tile's blocks
// contiguous so that a step streams it front to back. A 32-bit lane holds 4 consecutive k of one
// column; lane 4L + i of vector v is column 16L + 4v + i of the tile (the order of a 4 x 4
// transpose of 128-bit chunks, undone at the store). Per block:
//   Q8: 8 quads (k = 4i .. 4i + 3) x 4 vectors of 64 bytes (q + 128), then d (64 fp16);
//   Q4: 4 groups x 4 vectors of 64 bytes, byte = the GGUF byte of k = 4g + e (low nibble) and
//       k = 16 + 4g + e (high), then d and m (64 fp16 each).
template <int FMT>
constexpr int64_t block_bytes() {
  return FMT == kQ8 ? 2048 + 128 : 1024 + 256;
}

inline int64_t lane_column(int v, int lane) { return 16 * (lane / 4) + 4 * v + lane % 4; }

template <int FMT>
void repack_tile(const QView& w, int64_t t, uint8_t* out) {
  const int64_t N = w.N, n0 = t * kCols;
  const uint8_t* q = static_cast<const uint8_t*>(w.q);
  for (int64_t b = 0; b < w.K / kBlock; ++b) {
    uint8_t* pb = out + b * block_bytes<FMT>();
    const int groups = FMT == kQ8 ? 8 : 4;
    for (int g = 0; g < groups; ++g)
      for (int v = 0; v < 4; ++v)
        for (int lane = 0; lane < 16; ++lane)
          for (int e = 0; e < 4; ++e) {
            const int64_t n = n0 + lane_column(v, lane);
            uint8_t byte = FMT == kQ8 ? q[(b * kBlock + 4 * g + e) * N + n] ^ 0x80
                                      : q[(b * (kBlock / 2) + 4 * g + e) * N + n];
            pb[(g * 4 + v) * 64 + lane * 4 + e] = byte;
          }
    uint16_t* sc = reinterpret_cast<uint16_t*>(pb + (FMT == kQ8 ? 2048 : 1024));
    for (int v = 0; v < 4; ++v)
      for (int lane = 0; lane < 16; ++lane) {
        const int64_t n = n0 + lane_column(v, lane);
        sc[v * 16 + lane] = w.d[b * N + n];
        if (FMT == kQ4) sc[64 + v * 16 + lane] = w.m[b * N + n];
      }
  }
}

#if defined(TS_I8_VNNI)
// 4 x 4 transpose of 128-bit chunks: the lane order back to columns.
inline void transpose_chunks(__m512 (&v)[4]) {
  const __m512 t0 = _mm512_shuffle_f32x4(v[0], v[1], 0x44), t1 = _mm512_shuffle_f32x4(v[0], v[1], 0xEE);
  const __m512 t2 = _mm512_shuffle_f32x4(v[2], v[3], 0x44), t3 = _mm512_shuffle_f32x4(v[2], v[3], 0xEE);
  v[0] = _mm512_shuffle_f32x4(t0, t2, 0x88);
  v[1] = _mm512_shuffle_f32x4(t0, t2, 0xDD);
  v[2] = _mm512_shuffle_f32x4(t1, t3, 0x88);
  v[3] = _mm512_shuffle_f32x4(t1, t3, 0xDD);
}

inline __m512 load_f16x16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

inline __m512i x4_of(const QAct& x, int64_t row, int64_t k) {
  int32_t v;
  std::memcpy(&v, x.q.data() + row * x.K + k, 4);
  return _mm512_set1_epi32(v);
}

// MR rows (from row m0) against one repacked tile: c[m, 0 .. 64) (+)= ... (+ bias).
template <int FMT, int MR>
void rows_tile(const QAct& x, int64_t m0, const uint8_t* tile, float* c, int64_t ldc,
               const float* bias, bool accumulate, const uint8_t* /*next: AVX2 only*/ = nullptr) {
  __m512 fa[MR][4];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < 4; ++v) fa[m][v] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0f);
  for (int64_t b = 0; b < x.nb; ++b) {
    const uint8_t* pb = tile + b * block_bytes<FMT>();
    _mm_prefetch(reinterpret_cast<const char*>(pb + 4 * block_bytes<FMT>()), _MM_HINT_T0);
    __m512i ia[MR][4];
    for (int m = 0; m < MR; ++m)
      for (int v = 0; v < 4; ++v) ia[m][v] = _mm512_setzero_si512();
    const int64_t k0 = b * kBlock;
    if constexpr (FMT == kQ8) {
      for (int g = 0; g < 8; ++g) {
        __m512i wv[4];
        for (int v = 0; v < 4; ++v) wv[v] = _mm512_loadu_si512(pb + (g * 4 + v) * 64);
        for (int m = 0; m < MR; ++m) {
          const __m512i xb = x4_of(x, m0 + m, k0 + 4 * g);
          for (int v = 0; v < 4; ++v) ia[m][v] = _mm512_dpbusd_epi32(ia[m][v], wv[v], xb);
        }
      }
    } else {
      for (int g = 0; g < 4; ++g) {
        __m512i lo[4], hi[4];
        for (int v = 0; v < 4; ++v) {
          const __m512i raw = _mm512_loadu_si512(pb + (g * 4 + v) * 64);
          lo[v] = _mm512_and_si512(raw, low);
          hi[v] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
        }
        for (int m = 0; m < MR; ++m) {
          const __m512i xl = x4_of(x, m0 + m, k0 + 4 * g), xh = x4_of(x, m0 + m, k0 + 16 + 4 * g);
          for (int v = 0; v < 4; ++v) {
            ia[m][v] = _mm512_dpbusd_epi32(ia[m][v], lo[v], xl);
            ia[m][v] = _mm512_dpbusd_epi32(ia[m][v], hi[v], xh);
          }
        }
      }
    }
    const uint16_t* sc = reinterpret_cast<const uint16_t*>(pb + (FMT == kQ8 ? 2048 : 1024));
    __m512 d[4], mn[4];
    for (int v = 0; v < 4; ++v) {
      d[v] = load_f16x16(sc + 16 * v);
      if constexpr (FMT == kQ4) mn[v] = load_f16x16(sc + 64 + 16 * v);
    }
    for (int m = 0; m < MR; ++m) {
      const int64_t i = (m0 + m) * x.nb + b;
      const __m512 dx = _mm512_set1_ps(x.d[i]);
      const __m512i corr = _mm512_set1_epi32(128 * x.qs[i]);
      const __m512 sx = _mm512_set1_ps(x.s[i]);
      for (int v = 0; v < 4; ++v) {
        const __m512i iv = FMT == kQ8 ? _mm512_sub_epi32(ia[m][v], corr) : ia[m][v];
        fa[m][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iv), _mm512_mul_ps(d[v], dx), fa[m][v]);
        if constexpr (FMT == kQ4) fa[m][v] = _mm512_fmadd_ps(mn[v], sx, fa[m][v]);
      }
    }
  }
  for (int m = 0; m < MR; ++m) {
    transpose_chunks(fa[m]);
    float* cm = c + (m0 + m) * ldc;
    for (int v = 0; v < 4; ++v) {
      __m512 o = fa[m][v];
      if (accumulate) o = _mm512_add_ps(o, _mm512_loadu_ps(cm + 16 * v));
      if (bias) o = _mm512_add_ps(o, _mm512_loadu_ps(bias + 16 * v));
      _mm512_storeu_ps(cm + 16 * v, o);
    }
  }
}

#else
// AVX2: one register holds 8 of a 64-byte vector's 16 lanes (half h: lanes 8h .. 8h + 7, the
// columns 32h + 4v + (0 .. 3) and 32h + 16 + 4v + (0 .. 3)). A call runs MR rows against one of
// the tile's 8 (v, h) column groups over every block; the tile stays in L1/L2 between the groups.
inline __m256i x4_of(const QAct& x, int64_t row, int64_t k) {
  int32_t v;
  std::memcpy(&v, x.q.data() + row * x.K + k, 4);
  return _mm256_set1_epi32(v);
}

template <int FMT, int MR>
void rows_group(const QAct& x, int64_t m0, const uint8_t* tile, int v, int h, float* c,
                int64_t ldc, const float* bias, bool accumulate, const char* pf, int64_t pf_lines) {
  __m256 fa[MR];
  for (int m = 0; m < MR; ++m) fa[m] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi8(0x0f), flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i ones = _mm256_set1_epi16(1);
  const bool first = v == 0 && h == 0;  // the first pass brings the tile in: prefetch ahead
  const int64_t pf_step = (pf_lines + x.nb - 1) / x.nb;  // lines of the next tile per block
  for (int64_t b = 0; b < x.nb; ++b) {
    const uint8_t* pb = tile + b * block_bytes<FMT>();
    if (first && b + 2 < x.nb) {
      const char* ahead = reinterpret_cast<const char*>(pb + 2 * block_bytes<FMT>());
      for (int64_t o = 0; o < block_bytes<FMT>(); o += 64) _mm_prefetch(ahead + o, _MM_HINT_T0);
    }
    for (int64_t l = b * pf_step; l < std::min(pf_lines, (b + 1) * pf_step); ++l)
      _mm_prefetch(pf + 64 * l, _MM_HINT_T1);
    const int64_t k0 = b * kBlock;
    __m256i ia[MR];
    if constexpr (FMT == kQ8) {
      for (int m = 0; m < MR; ++m) ia[m] = _mm256_setzero_si256();
      for (int g = 0; g < 8; ++g) {
        const __m256i w = _mm256_xor_si256(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + (g * 4 + v) * 64 + 32 * h)),
            flip);
        const __m256i aw = _mm256_abs_epi8(w);
        for (int m = 0; m < MR; ++m) {
          const __m256i xs = _mm256_sign_epi8(x4_of(x, m0 + m, k0 + 4 * g), w);
          ia[m] = _mm256_add_epi32(ia[m], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xs), ones));
        }
      }
    } else {
      __m256i i16[MR];
      for (int m = 0; m < MR; ++m) i16[m] = _mm256_setzero_si256();
      const auto group = [&](int g) {
        const __m256i raw =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + (g * 4 + v) * 64 + 32 * h));
        const __m256i lo = _mm256_and_si256(raw, low);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
        for (int m = 0; m < MR; ++m) {
          i16[m] = _mm256_add_epi16(i16[m], _mm256_maddubs_epi16(lo, x4_of(x, m0 + m, k0 + 4 * g)));
          i16[m] = _mm256_add_epi16(i16[m],
                                    _mm256_maddubs_epi16(hi, x4_of(x, m0 + m, k0 + 16 + 4 * g)));
        }
      };
      if constexpr (MR >= 3) {
        // Rolled from 3 rows on: unrolled, GCC computes all of a block's products before
        // summing them and spills most to the stack (1.2-2x slower at 3-256 rows on a Zen 3
        // EPYC). At 1 row the unrolled loop is ~15% faster, at 2 the same.
#pragma GCC unroll 1
        for (int g = 0; g < 4; ++g) group(g);
      } else {
        for (int g = 0; g < 4; ++g) group(g);
      }
      for (int m = 0; m < MR; ++m) ia[m] = _mm256_madd_epi16(i16[m], ones);
    }
    const uint16_t* sc = reinterpret_cast<const uint16_t*>(pb + (FMT == kQ8 ? 2048 : 1024));
    const __m256 d = _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + 16 * v + 8 * h)));
    __m256 mn = _mm256_setzero_ps();
    if constexpr (FMT == kQ4)
      mn = _mm256_cvtph_ps(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + 64 + 16 * v + 8 * h)));
    for (int m = 0; m < MR; ++m) {
      const int64_t i = (m0 + m) * x.nb + b;
      fa[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[m]), _mm256_mul_ps(d, _mm256_set1_ps(x.d[i])),
                              fa[m]);
      if constexpr (FMT == kQ4) fa[m] = _mm256_fmadd_ps(mn, _mm256_set1_ps(x.s[i]), fa[m]);
    }
  }
  const int64_t n_lo = 32 * h + 4 * v, n_hi = n_lo + 16;
  for (int m = 0; m < MR; ++m) {
    float* cm = c + (m0 + m) * ldc;
    __m128 lo = _mm256_castps256_ps128(fa[m]), hi = _mm256_extractf128_ps(fa[m], 1);
    if (accumulate) {
      lo = _mm_add_ps(lo, _mm_loadu_ps(cm + n_lo));
      hi = _mm_add_ps(hi, _mm_loadu_ps(cm + n_hi));
    }
    if (bias) {
      lo = _mm_add_ps(lo, _mm_loadu_ps(bias + n_lo));
      hi = _mm_add_ps(hi, _mm_loadu_ps(bias + n_hi));
    }
    _mm_storeu_ps(cm + n_lo, lo);
    _mm_storeu_ps(cm + n_hi, hi);
  }
}

// MR rows against every column group of one tile. `next` (or null): the tile this thread is
// likely to run next, prefetched into L2 an eighth per group pass, so that the 7 passes over a
// tile already in cache overlap the next tile's trip from memory (at a few rows a step is
// bound by streaming the weights).
template <int FMT, int MR>
void rows_tile(const QAct& x, int64_t m0, const uint8_t* tile, float* c, int64_t ldc,
               const float* bias, bool accumulate, const uint8_t* next = nullptr) {
  const int64_t lines = next ? (x.nb * block_bytes<FMT>() + 63) / 64 : 0, per = (lines + 7) / 8;
  for (int v = 0; v < 4; ++v)
    for (int h = 0; h < 2; ++h) {
      const int64_t p = 2 * v + h, l0 = std::min(lines, p * per);
      rows_group<FMT, MR>(x, m0, tile, v, h, c, ldc, bias, accumulate,
                          reinterpret_cast<const char*>(next) + 64 * l0,
                          std::min(lines, l0 + per) - l0);
    }
}

#endif

// Columns past the last whole tile, scalar, with the same integer sums and float steps.
template <int FMT>
void tail_columns_i8(const QAct& x, const QView& w, int64_t n0, int64_t n1, float* c,
                     const float* bias, bool accumulate) {
  const int64_t N = w.N;
  for (int64_t m = 0; m < x.M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      float f = 0.f;
      for (int64_t b = 0; b < x.nb; ++b) {
        int32_t sum = 0;
        const int8_t* xq = x.q.data() + m * x.K + b * kBlock;
        for (int64_t j = 0; j < kBlock; ++j) {
          int32_t q;
          if constexpr (FMT == kQ8) {
            q = static_cast<const int8_t*>(w.q)[(b * kBlock + j) * N + n];
          } else {
            const uint8_t byte =
                static_cast<const uint8_t*>(w.q)[(b * (kBlock / 2) + j % 16) * N + n];
            q = j < 16 ? (byte & 15) : (byte >> 4);
          }
          sum += q * xq[j];
        }
        const int64_t i = m * x.nb + b;
        f = std::fma(static_cast<float>(sum), half_to_float(w.d[b * N + n]) * x.d[i], f);
        if constexpr (FMT == kQ4) f = std::fma(half_to_float(w.m[b * N + n]), x.s[i], f);
      }
      float* o = c + m * N + n;
      if (accumulate) f += *o;
      if (bias) f += bias[n];
      *o = f;
    }
}

template <int FMT>
void run_i8(const float* a, int64_t lda, const QView& w, int64_t M, float* c, const float* bias,
            bool accumulate) {
  thread_local QAct x;
  quantize_rows(a, lda, M, w.K, x);
  const int64_t N = w.N, tiles = N / kCols, tile_bytes = w.K / kBlock * block_bytes<FMT>();
  const QAct& xs = x;
  const uint8_t* packed = static_cast<const uint8_t*>(w.i8);
  // Units of (tile, up to kRowChunk rows), ~8 claims per thread (parallel.h): a thread
  // descheduled mid-claim holds little. The tail columns, if any, are the last unit.
  constexpr int64_t kRowChunk = 16 * kMR;
  const int64_t chunks = (M + kRowChunk - 1) / kRowChunk, units = tiles * chunks + 1;
  claim_for(0, units, 1, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      if (u == units - 1) {
        if (tiles * kCols < N) tail_columns_i8<FMT>(xs, w, tiles * kCols, N, c, bias, accumulate);
        continue;
      }
      const int64_t t = u / chunks, n0 = t * kCols, m1 = std::min(M, (u % chunks + 1) * kRowChunk);
      const uint8_t* tile = packed + t * tile_bytes;
      const float* bt = bias ? bias + n0 : nullptr;
      int64_t m = u % chunks * kRowChunk;
      // The tile to prefetch while this one runs, at a few rows (where a step is bound by
      // streaming the weights): the next unit of this claim, or after its last, the first unit
      // of the claim this thread is likely to take next (the other threads hold the ones in
      // between). Over the 30 layers' GEMMs and the head of SmolLM2-135M on a Zen 3 EPYC, weights
      // cold: -20% time at 1 row, -15% at 4, the same at 8 and 16, +3-18% at 32 (prefetching
      // what the hardware already streams in time), hence the bound.
      const uint8_t* next = nullptr;
      if (M < 2 * kMR) {
        const int64_t nu = u + 1 < u1 ? u + 1 : u1 + (u1 - u0) * (kernel_threads() - 1);
        if (nu < tiles) next = packed + nu * tile_bytes;
      }
      for (; m + kMR <= m1; m += kMR) {
        rows_tile<FMT, kMR>(xs, m, tile, c + n0, N, bt, accumulate, m + kMR == m1 ? next : nullptr);
      }
      if (m1 - m == 3) rows_tile<FMT, 3>(xs, m, tile, c + n0, N, bt, accumulate, next);
      if (m1 - m == 2) rows_tile<FMT, 2>(xs, m, tile, c + n0, N, bt, accumulate, next);
      if (m1 - m == 1) rows_tile<FMT, 1>(xs, m, tile, c + n0, N, bt, accumulate, next);
    }
  }, 8);
}

}  // namespace

bool int8_products_available() { return true; }

void dequantize_i8(const QView& w, float* out) {
  const bool q8 = w.fmt == kQ8;
  const int64_t N = w.N, nb = w.K / kBlock, bytes = q8 ? block_bytes<kQ8>() : block_bytes<kQ4>();
  claim_for(0, N / kCols, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* pb = static_cast<const uint8_t*>(w.i8) + (t * nb + b) * bytes;
        const uint16_t* sc = reinterpret_cast<const uint16_t*>(pb + (q8 ? 2048 : 1024));
        for (int g = 0; g < (q8 ? 8 : 4); ++g)
          for (int v = 0; v < 4; ++v)
            for (int lane = 0; lane < 16; ++lane) {
              const int64_t n = t * kCols + lane_column(v, lane);
              const float d = half_to_float(sc[v * 16 + lane]);
              const float mn = q8 ? 0.f : half_to_float(sc[64 + v * 16 + lane]);
              for (int e = 0; e < 4; ++e) {
                const uint8_t byte = pb[(g * 4 + v) * 64 + lane * 4 + e];
                const int64_t k = b * kBlock + 4 * g + e;
                if (q8) {
                  out[k * N + n] = d * static_cast<float>(static_cast<int8_t>(byte ^ 0x80));
                } else {
                  out[k * N + n] = static_cast<float>(byte & 15) * d + mn;
                  out[(k + 16) * N + n] = static_cast<float>(byte >> 4) * d + mn;
                }
              }
            }
      }
  });
}

float value_i8(const QView& w, int64_t k, int64_t n) {
  const int64_t t = n / kCols, c = n % kCols, b = k / kBlock, kk = k % kBlock;
  const int v = static_cast<int>((c % 16) / 4), lane = static_cast<int>(4 * (c / 16) + c % 4);
  const bool q8 = w.fmt == kQ8;
  const int64_t bytes = q8 ? block_bytes<kQ8>() : block_bytes<kQ4>();
  const uint8_t* pb = static_cast<const uint8_t*>(w.i8) + (t * (w.K / kBlock) + b) * bytes;
  const uint16_t* sc = reinterpret_cast<const uint16_t*>(pb + (q8 ? 2048 : 1024));
  const float d = half_to_float(sc[v * 16 + lane]);
  if (q8) {
    const int g = static_cast<int>(kk / 4), e = static_cast<int>(kk % 4);
    return d * static_cast<float>(static_cast<int8_t>(pb[(g * 4 + v) * 64 + lane * 4 + e] ^ 0x80));
  }
  const int64_t j = kk % 16;
  const int g = static_cast<int>(j / 4), e = static_cast<int>(j % 4);
  const uint8_t byte = pb[(g * 4 + v) * 64 + lane * 4 + e];
  const float qv = static_cast<float>(kk < 16 ? byte & 15 : byte >> 4);
  return qv * d + half_to_float(sc[64 + v * 16 + lane]);
}

at::Tensor repack_i8(const QView& w) {
  const int64_t tiles = w.N / kCols;
  const int64_t bytes = w.fmt == kQ8 ? block_bytes<kQ8>() : block_bytes<kQ4>();
  const int64_t tile_bytes = w.K / kBlock * bytes;
  auto out = at::empty({std::max<int64_t>(1, tiles * tile_bytes)}, at::kByte);
  uint8_t* o = out.data_ptr<uint8_t>();
  claim_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      if (w.fmt == kQ8)
        repack_tile<kQ8>(w, t, o + t * tile_bytes);
      else
        repack_tile<kQ4>(w, t, o + t * tile_bytes);
    }
  });
  return out;
}

void qlinear_i8(const float* a, int64_t lda, const QView& w, int64_t M, float* out,
                const float* bias, bool accumulate) {
  if (w.fmt == kQ8)
    run_i8<kQ8>(a, lda, w, M, out, bias, accumulate);
  else
    run_i8<kQ4>(a, lda, w, M, out, bias, accumulate);
}

#else
bool int8_products_available() { return false; }

at::Tensor repack_i8(const QView&) {
  TORCH_CHECK(false, "int8 products need AVX512_VNNI or AVX2");
}
float value_i8(const QView&, int64_t, int64_t) { TORCH_CHECK(false, "no int8 repack here"); }
void dequantize_i8(const QView&, float*) { TORCH_CHECK(false, "no int8 repack here"); }

void qlinear_i8(const float*, int64_t, const QView&, int64_t, float*, const float*, bool) {
  TORCH_CHECK(false, "int8 products need AVX512_VNNI or AVX2");
}
#endif

}  // namespace tierserve
