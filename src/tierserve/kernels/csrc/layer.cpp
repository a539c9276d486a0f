// One whole decoder layer of a Llama-family model in one call, for steps of few rows (decode
// and short chunks), where the ~15 separate PyTorch ops of a layer cost more in dispatch and
// allocation than in arithmetic:
//
//   h = rms_norm(x) ; qkv = h @ W_qkv (+ b) ; rope(q, k) ; K/V -> cache slots ;
//   x += attention(q, cache) @ W_o ; h = rms_norm(x) ; gu = h @ W_gate_up ;
//   x += (silu(gate) * up) @ W_down
//
// x (the residual stream) is updated in place. Tensor parallelism runs the two halves apart
// (`decoder_attention`, `decoder_mlp`: this rank's partial o and down products into `out`, to be
// summed over the ranks before they join the residual). Attention covers every row through segments
// (see attention.cpp), fresh prompts included: their keys are in the cache before they attend.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include <cmath>

#include "kv.h"
#include "qweight.h"
#include "vec.h"
#include "parallel.h"

namespace tierserve {

void paged_attention_into(const at::Tensor& q, const at::Tensor& k_cache,
                          const at::Tensor& v_cache, const at::Tensor& tables,
                          const at::Tensor& segments, double scale, at::Tensor& out);

namespace {

// out[t] = x[t] / rms(x[t]) * w, rows in parallel.
void rms_norm(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps) {
  claim_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * n;
      float* o = out + r * n;
      vf acc = vf{};
      int64_t i = 0;
      for (; i + VL <= n; i += VL) {
        vf v = vload(xr + i);
        acc = vfma(v, v, acc);
      }
      float ss = vsum(acc);
      for (; i < n; ++i) ss += xr[i] * xr[i];
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
      for (i = 0; i + VL <= n; i += VL) vstore(o + i, vload(xr + i) * inv * vload(w + i));
      for (; i < n; ++i) o[i] = xr[i] * inv * w[i];
    }
  });
}

// Rotate-half rope on `heads` heads of each row, in place; cos and sin_signed are [T, D]
// (sin's first half negated, as model/layers.py builds them).
void rope(float* x, int64_t row_stride, const float* cos, const float* sin, int64_t rows,
          int64_t heads, int64_t d) {
  const int64_t half = d / 2;
  claim_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    float tmp[512];
    for (int64_t r = r0; r < r1; ++r) {
      const float* c = cos + r * d;
      const float* s = sin + r * d;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x + r * row_stride + h * d;
        for (int64_t i = 0; i < d; ++i) tmp[i] = v[i];
        for (int64_t i = 0; i < d; ++i) v[i] = tmp[i] * c[i] + tmp[(i + half) % d] * s[i];
      }
    }
  });
}

// gu[t, :inter] = silu(gu[t, :inter]) * gu[t, inter:], in place.
void silu_mul(float* gu, int64_t rows, int64_t inter) {
  claim_for(0, rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* g = gu + r * 2 * inter;
      const float* u = g + inter;
      int64_t i = 0;
      for (; i + VL <= inter; i += VL) {
        vf x = vload(g + i);
        vf ax = x < 0 ? -x : x;
        vf e = vexp_nonpos(-ax);  // exp(-|x|): no overflow either way
        vf sig = x >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
        vstore(g + i, x * sig * vload(u + i));
      }
      for (; i < inter; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    }
  });
}

// Rows' K (or V) heads into their cache slots, narrowed to the cache's type: values as rows,
// keys into their block's K tiles (`keys`: attention.cpp's layout).
template <class T>
void write_kv_as(const float* src, int64_t row_stride, at::Tensor& cache, const int64_t* slots,
                 int64_t rows, int64_t kv_heads, int64_t slots_per_head, int64_t d, bool keys) {
  T* c = static_cast<T*>(cache.data_ptr());
  const int64_t bs = cache.size(2);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < kv_heads; ++h) {
      const float* x = src + r * row_stride + h * d;
      if (keys)
        k_store(x, c + (h * slots_per_head + slots[r] / bs * bs) * d, slots[r] % bs, d);
      else
        kv_store(x, c + (h * slots_per_head + slots[r]) * d, d);
    }
}

void write_kv(const float* src, int64_t row_stride, at::Tensor& cache, const int64_t* slots,
              int64_t rows, int64_t kv_heads, int64_t slots_per_head, int64_t d, bool keys) {
  switch (cache.scalar_type()) {
    case at::kHalf:
      return write_kv_as<KvHalf>(src, row_stride, cache, slots, rows, kv_heads, slots_per_head,
                                 d, keys);
    case at::kBFloat16:
      return write_kv_as<KvBf16>(src, row_stride, cache, slots, rows, kv_heads, slots_per_head,
                                 d, keys);
    default:
      return write_kv_as<float>(src, row_stride, cache, slots, rows, kv_heads, slots_per_head, d,
                                keys);
  }
}

}  // namespace

void decoder_attention(const at::Tensor& x, const QWeight& w_qkv,
                       const c10::optional<at::Tensor>& b_qkv, const QWeight& w_o,
                       const at::Tensor& ln_attn, const at::Tensor& cos, const at::Tensor& sin,
                       at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slots,
                       const at::Tensor& tables, const at::Tensor& segments, int64_t heads,
                       double eps, at::Tensor& out, bool add) {
  TORCH_CHECK(x.is_contiguous() && x.scalar_type() == at::kFloat, "decoder_layer: x");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && slots.is_contiguous() &&
                  slots.scalar_type() == at::kLong && ln_attn.is_contiguous(),
              "decoder_layer: contiguous cos, sin, int64 slots and norms expected");
  const int64_t T = x.size(0), hidden = x.size(1);
  const int64_t kvh = k_cache.size(0), d = k_cache.size(3);
  const int64_t slots_per_head = k_cache.size(1) * k_cache.size(2);
  const int64_t qkv_n = w_qkv.N;
  TORCH_CHECK(qkv_n == (heads + 2 * kvh) * d && cos.size(0) == T && cos.size(1) == d &&
                  slots.numel() == T && d <= 512,
              "decoder_layer: shapes do not fit");
  auto h = at::empty_like(x);
  rms_norm(x.data_ptr<float>(), ln_attn.data_ptr<float>(), h.data_ptr<float>(), T, hidden,
           static_cast<float>(eps));
  auto qkv = at::empty({T, qkv_n}, x.options());
  weight_linear_into(h, w_qkv, b_qkv, qkv, false);
  float* qp = qkv.data_ptr<float>();
  rope(qp, qkv_n, cos.data_ptr<float>(), sin.data_ptr<float>(), T, heads + kvh, d);
  const int64_t* sp = slots.data_ptr<int64_t>();
  TORCH_CHECK(kv_dtype_supported(k_cache.scalar_type()) &&
                  v_cache.scalar_type() == k_cache.scalar_type() && k_cache.is_contiguous() &&
                  v_cache.is_contiguous(),
              "decoder_layer: contiguous float32, float16 or bfloat16 caches expected");
  write_kv(qp + heads * d, qkv_n, k_cache, sp, T, kvh, slots_per_head, d, true);
  write_kv(qp + (heads + kvh) * d, qkv_n, v_cache, sp, T, kvh, slots_per_head, d, false);
  auto attn = at::empty({T, heads, d}, x.options());
  auto q = qkv.view({T, heads + 2 * kvh, d}).narrow(1, 0, heads);
  paged_attention_into(q, k_cache, v_cache, tables, segments, 1.0 / std::sqrt(double(d)), attn);
  weight_linear_into(attn.view({T, heads * d}), w_o, c10::nullopt, out, add);
}

void decoder_mlp(const at::Tensor& x, const QWeight& w_gate_up, const QWeight& w_down,
                 const at::Tensor& ln_mlp, double eps, at::Tensor& out, bool add) {
  TORCH_CHECK(x.is_contiguous() && x.scalar_type() == at::kFloat && ln_mlp.is_contiguous(),
              "decoder_layer: x and its norm");
  const int64_t T = x.size(0), hidden = x.size(1), inter = w_down.K;
  TORCH_CHECK(w_gate_up.N == 2 * inter, "decoder_layer: shapes do not fit");
  auto h = at::empty_like(x);
  rms_norm(x.data_ptr<float>(), ln_mlp.data_ptr<float>(), h.data_ptr<float>(), T, hidden,
           static_cast<float>(eps));
  auto gu = at::empty({T, 2 * inter}, x.options());
  weight_linear_into(h, w_gate_up, c10::nullopt, gu, false);
  silu_mul(gu.data_ptr<float>(), T, inter);
  weight_linear_into(gu.narrow(1, 0, inter), w_down, c10::nullopt, out, add);
}

void decoder_layer(at::Tensor& x, const QWeight& w_qkv, const c10::optional<at::Tensor>& b_qkv,
                   const QWeight& w_o, const QWeight& w_gate_up, const QWeight& w_down,
                   const at::Tensor& ln_attn, const at::Tensor& ln_mlp, const at::Tensor& cos,
                   const at::Tensor& sin, at::Tensor& k_cache, at::Tensor& v_cache,
                   const at::Tensor& slots, const at::Tensor& tables, const at::Tensor& segments,
                   int64_t heads, double eps) {
  decoder_attention(x, w_qkv, b_qkv, w_o, ln_attn, cos, sin, k_cache, v_cache, slots, tables,
                    segments, heads, eps, x, true);
  decoder_mlp(x, w_gate_up, w_down, ln_mlp, eps, x, true);
}

}  // namespace tierserve
