// Seeded sampling by the Gumbel-max trick with counter-based noise: for row r,
//   token = argmax_v  logits[r, v] + G(key_r, v),   G = -log(-log(u)),  u = hash(key_r, v)
// which draws from softmax(logits[r]) exactly (up to the 23-bit resolution of u). The noise of
// a row depends only on its 32-bit key (derived by the caller from the request's seed and output
// index), never on the batch, so seeded requests repeat whatever they are batched with.
//
// G is bounded: u lies in [2^-24, 1 - 2^-24], so G lies in [-2.82, 16.64]. A token whose logit
// is more than 19.46 below the row's maximum cannot beat the maximum's own key, so the kernel
// computes noise only for tokens within 21 of the maximum: the same token as the full
// computation, for a fraction of the logarithms. Excluded tokens carry -inf logits.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>

#include "vec.h"

namespace tierserve {

inline uint32_t fmix32(uint32_t h) {  // MurmurHash3's finaliser: a bijection with full avalanche
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

inline float gumbel(uint32_t key, uint32_t v) {
  const uint32_t h = fmix32(fmix32(v * 0x9E3779B9u + 1u) ^ key);
  const float u = (static_cast<float>(h >> 9) + 0.5f) * (1.0f / 8388608.0f);
  return -std::log(-std::log(u));
}

// logits: [S, V] float32; keys: [S] int64 (low 32 bits used); returns [S] int64 token ids
// (0 for a row with no finite logit).
at::Tensor gumbel_argmax(const at::Tensor& logits, const at::Tensor& keys) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.stride(1) == 1,
              "gumbel_argmax: float32 [S, V] logits with contiguous rows expected");
  TORCH_CHECK(keys.dim() == 1 && keys.size(0) == logits.size(0) && keys.scalar_type() == at::kLong,
              "gumbel_argmax: int64 keys [S] expected");
  const int64_t S = logits.size(0), V = logits.size(1), ld = logits.stride(0);
  auto out = at::zeros({S}, keys.options());
  const float* L = logits.data_ptr<float>();
  const int64_t* K = keys.contiguous().data_ptr<int64_t>();
  int64_t* O = out.data_ptr<int64_t>();
  at::parallel_for(0, S, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = L + r * ld;
      const float ninf = -std::numeric_limits<float>::infinity();
      vf mv = vbroadcast(ninf);
      int64_t v = 0;
      for (; v + VL <= V; v += VL) mv = vmax(mv, vload(row + v));
      float mx = ninf;
      for (int i = 0; i < VL; ++i) mx = std::max(mx, mv[i]);
      for (; v < V; ++v) mx = std::max(mx, row[v]);
      if (!std::isfinite(mx)) continue;
      const float floor = mx - 21.0f;
      const auto key = static_cast<uint32_t>(K[r]);
      float best = ninf;
      int64_t arg = 0;
      for (v = 0; v < V; ++v) {
        if (!(row[v] >= floor)) continue;
        const float k = row[v] + gumbel(key, static_cast<uint32_t>(v));
        if (k > best) {
          best = k;
          arg = v;
        }
      }
      O[r] = arg;
    }
  });
  return out;
}

}  // namespace tierserve
