// A weight in one of the GGUF block formats the quantized GEMM runs (qgemm.cpp): the tensors,
// and a raw view of them for the kernels.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstring>

namespace tierserve {

constexpr int kF32 = 0;  // float32 [K, N] (the `q` tensor)
constexpr int kQ8 = 1;  // q8_0
constexpr int kQ4 = 2;  // q4_0 and q4_1

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) {
        man <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000 | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

struct QView {
  int fmt;
  int64_t K, N;
  const void* q;
  const uint16_t* d;
  const uint16_t* m;
  bool bf16;  // products in bf16, sums in float32 (see QWeight)
  bool int8;  // int8 activations, integer products (qgemm_i8.cpp) over `i8`
  const void* i8;  // the weight repacked for them (repack_i8), or null
  float value(int64_t row, int64_t n) const;  // the weight of panel row `row`, column n
};

struct QWeight {
  QWeight(int64_t fmt, at::Tensor q, c10::optional<at::Tensor> d, c10::optional<at::Tensor> m,
          bool bf16 = false, bool int8 = false);
  QView view() const;
  int64_t fmt, K, N;
  at::Tensor q, d, m;
  at::Tensor i8;  // with int8: the repacked weight the integer kernel streams
  // With int8 and whole tiles (N % 64 == 0) the GGUF-layout tensors are dropped after the
  // repack (q, d, m undefined): every reader goes through `i8` instead.
  bool released = false;
  // Quantized formats only: products in bf16 with float32 sums, where the CPU has AVX512_BF16
  // (qgemm.cpp): ~2x the multiply-adds per instruction on compute-bound steps. Off elsewhere.
  bool bf16;
  // Quantized formats only: activations quantized to int8 per block of 32 and integer products
  // (AVX512_VNNI or AVX2, qgemm_i8.cpp): ~4x fewer instructions per weight than bf16 at few rows
  // (AVX2: 2-3x faster than its float32 products at every row count, docs/performance.md). Takes
  // precedence over bf16. Off where the CPU lacks the instructions.
  bool int8;
  // From this many rows on, each thread dequantizes its column tile once into a panel and
  // runs every row block over it (below, every row block dequantizes in registers).
  static int64_t panel_min_rows;
  static bool bf16_available();
  static bool int8_available();
};

// out (+)= a @ W (+ bias) for a weight of any format (float32 goes to gemm.cpp's kernel).
void weight_linear_into(const at::Tensor& a, const QWeight& w, const c10::optional<at::Tensor>& bias,
                        at::Tensor& out, bool accumulate);

bool int8_products_available();
at::Tensor repack_i8(const QView& w);
float value_i8(const QView& w, int64_t k, int64_t n);  // the weight at (k, n) from `i8`
void dequantize_i8(const QView& w, float* out);         // all of it, [K, N] (N % 64 == 0)
void qlinear_i8(const float* a, int64_t lda, const QView& w, int64_t M, float* out,
                const float* bias, bool accumulate);

void qlinear_raw(const float* a, int64_t lda, const QView& w, int64_t M, float* out,
                 const float* bias, bool accumulate);

}  // namespace tierserve
