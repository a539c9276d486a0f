// Seeded sampling by the Gumbel-max trick with counter-based noise: for row r,
//   token = argmax_v  logits[r, v] + G(key_r, v),   G = -log(-log(u)),  u = hash(key_r, v)
// which draws from softmax(logits[r]) exactly (up to the 23-bit resolution of u). The noise of
// a row depends only on its 32-bit key (derived by the caller from the request's seed and output
// index), never on the batch, so seeded requests repeat whatever they are batched with.
//
// G is bounded: u lies in [2^-24, 1 - 2^-24], so G lies in [-2.82, 16.64]. A token whose logit
// is more than 19.46 below the row's maximum cannot beat the maximum's own key, so the kernel
// ignores tokens more than 21 below the maximum. Excluded tokens carry -inf logits. Hash, logs
// and the running argmax are vectorised (vec.h), VL tokens at a time.
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>

#include <cmath>
#include <limits>
#include <tuple>

#include "vec.h"
#include "parallel.h"

namespace tierserve {

// Noise keys of VL consecutive tokens v0.. of a row: l + G, or -inf where l is below `floor`.
inline vf noisy_keys(vf l, uint32_t key, uint32_t v0, float floor) {
  vu v = vu{} + v0;
  for (int i = 0; i < VL; ++i) v[i] += i;
  vu h = v * 0x9E3779B9u + 1u;
  for (int round = 0; round < 2; ++round) {  // fmix32(fmix32(v * golden + 1) ^ key)
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    if (round == 0) h ^= key;
  }
  vf u = (__builtin_convertvector(h >> 9, vf) + 0.5f) * (1.0f / 8388608.0f);
  vf g = -vlog_pos(-vlog_pos(u));
  const vf ninf = vbroadcast(-std::numeric_limits<float>::infinity());
  return l >= floor ? l + g : ninf;
}

// logits: [S, V] float32; keys: [S] int64 (low 32 bits used); returns [S] int64 token ids
// (0 for a row with no finite logit). Ties go to the lowest token id, as torch.argmax does.
at::Tensor gumbel_argmax(const at::Tensor& logits, const at::Tensor& keys) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.stride(1) == 1,
              "gumbel_argmax: float32 [S, V] logits with contiguous rows expected");
  TORCH_CHECK(keys.dim() == 1 && keys.size(0) == logits.size(0) && keys.scalar_type() == at::kLong,
              "gumbel_argmax: int64 keys [S] expected");
  const int64_t S = logits.size(0), V = logits.size(1), ld = logits.stride(0);
  auto out = at::zeros({S}, keys.options());
  const float* L = logits.data_ptr<float>();
  auto kc = keys.contiguous();
  const int64_t* K = kc.data_ptr<int64_t>();
  int64_t* O = out.data_ptr<int64_t>();
  claim_for(0, S, 1, [&](int64_t r0, int64_t r1) {
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
      vf best = vbroadcast(ninf);
      vi best_at = vi{} - 1;
      vi at_v = vi{};
      for (int i = 0; i < VL; ++i) at_v[i] = i;
      for (v = 0; v + VL <= V; v += VL, at_v += VL) {
        vf k = noisy_keys(vload(row + v), key, static_cast<uint32_t>(v), floor);
        vi better = k > best;  // strict: the earliest token of each lane keeps a tie
        best = better ? k : best;
        best_at = better ? at_v : best_at;
      }
      float top = ninf;
      int64_t arg = 0;
      for (int i = 0; i < VL; ++i)
        if (best_at[i] >= 0 && (best[i] > top || (best[i] == top && best_at[i] < arg))) {
          top = best[i];
          arg = best_at[i];
        }
      if (v < V) {  // the last partial vector, through a zero-padded copy
        float tail[VL];
        for (int i = 0; i < VL; ++i) tail[i] = v + i < V ? row[v + i] : ninf;
        vf k = noisy_keys(vload(tail), key, static_cast<uint32_t>(v), floor);
        for (int i = 0; i < VL && v + i < V; ++i)
          if (k[i] > top) {
            top = k[i];
            arg = v + i;
          }
      }
      O[r] = arg;
    }
  });
  return out;
}


// Per row of logits [S, V] float32: the argmax (ties to the lowest token id, a NaN counts as the
// maximum, as torch.argmax) and the log-sum-exp (max + log sum exp(l - max); NaN if the row holds
// a NaN, the max itself if it is infinite). One read for the max, one for the sum, in vector
// lanes: torch.argmax and torch.logsumexp take ~10x as long on one thread (~0.14 ms a row of a
// 49,152-token vocabulary on a Zen 3 EPYC). Returns (tokens int64 [S], lse float32 [S]).
std::tuple<at::Tensor, at::Tensor> argmax_logsumexp(const at::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.stride(1) == 1,
              "argmax_logsumexp: float32 [S, V] logits with contiguous rows expected");
  const int64_t S = logits.size(0), V = logits.size(1), ld = logits.stride(0);
  TORCH_CHECK(V > 0, "argmax_logsumexp: empty rows");
  auto tokens = at::zeros({S}, logits.options().dtype(at::kLong));
  auto lse = at::zeros({S}, logits.options());
  const float* L = logits.data_ptr<float>();
  int64_t* T = tokens.data_ptr<int64_t>();
  float* E = lse.data_ptr<float>();
  claim_for(0, S, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = L + r * ld;
      const float ninf = -std::numeric_limits<float>::infinity();
      // Pass 1: per lane, the maximum and its earliest position; NaN is tracked apart.
      vf best = vbroadcast(ninf);
      vi best_at = vi{};
      vi at_v = vi{};
      for (int i = 0; i < VL; ++i) at_v[i] = i;
      vi nan_seen = vi{};
      int64_t v = 0;
      for (; v + VL <= V; v += VL, at_v += VL) {
        const vf x = vload(row + v);
        nan_seen |= x != x;
        const vi better = x > best;  // strict: each lane keeps its earliest maximum
        best = better ? x : best;
        best_at = better ? at_v : best_at;
      }
      float mx = ninf;
      int64_t arg = -1;
      bool nan = false;
      for (int i = 0; i < VL; ++i) {
        nan = nan || nan_seen[i] != 0;
        if (v > 0 && (arg < 0 || best[i] > mx || (best[i] == mx && best_at[i] < arg))) {
          mx = best[i];
          arg = best_at[i];
        }
      }
      for (; v < V; ++v) {
        if (row[v] != row[v]) nan = true;
        if (arg < 0 || row[v] > mx) {
          mx = row[v];
          arg = v;
        }
      }
      if (nan) {  // torch.argmax: the first NaN
        for (v = 0; v < V && row[v] == row[v]; ++v) {
        }
        T[r] = v;
        E[r] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      T[r] = arg;
      if (!std::isfinite(mx)) {  // every logit -inf, or one +inf
        E[r] = mx;
        continue;
      }
      // Pass 2: sum exp(l - max), VL partial sums.
      const vf m = vbroadcast(mx);
      vf acc = vf{};
      for (v = 0; v + VL <= V; v += VL) acc += vexp_nonpos(vload(row + v) - m);
      float sum = vsum(acc);
      for (; v < V; ++v) sum += std::exp(row[v] - mx);
      E[r] = mx + std::log(sum);
    }
  });
  return {tokens, lse};
}

}  // namespace tierserve
