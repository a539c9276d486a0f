// Paged attention straight from the KV cache: no gathered copy of any context.
//
// Cache layout (one layer): [kv_heads, num_blocks, block_size, head_dim]. V holds each key's
// values in a row; K holds each block as block_size / VL tiles of VL keys, dimension-major
// (key u, dim d of a block at ((u / VL) * head_dim + d) * VL + u % VL: kv.h's k_offset), so that
// one vector load reads dimension d of VL keys (run_rows) and the writers store keys there
// (layer.cpp, attention/base.py's write_kv with `k_tile`).
// A *segment* is a run of consecutive query rows of one sequence: row i of segment s sits at
// flat row `row0 + i`, reads its context through block-table row `table` and attends to
// positions [0, ctx0 + i) (so a decode is a 1-row segment with ctx0 = its length, and a prefill
// chunk continuing a cached prefix of P tokens is an n-row segment with ctx0 = P + 1).
//
// Work is split into (tile of rows of a segment) x (KV head) tasks across threads. A segment of
// fewer than kLaneRows rows (decodes, speculative verification) goes by keys across lanes
// (run_rows, below); a longer one (a prompt chunk) by queries across lanes (run_lanes, further
// down: ~2x PyTorch's SDPA on a 160-token prompt here).
// A task walks its context in order, so every K/V block is read once per tile for all rows of
// the tile and all query heads of the group (grouped-query attention), and keeps an online
// softmax (running max, running sum, rescaled accumulator) per query head.
//
// Both kernels compute each query by the same operations in the same order (see "One query's
// arithmetic" below), so a row's output is the same bits whatever its segment: a prompt served
// fresh, after a cached prefix, in chunks, recomputed after preemption, or a decode.
//
// The cache holds float32, float16 or bfloat16 (`--kv-cache-dtype`): a 16-bit cache is widened
// to float32 as it is loaded (kv.h), so the arithmetic is the same float32 arithmetic either way,
// on half the bytes. Decode attention at long context is bound by reading the cache.
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kv.h"
#include "vec.h"
#include "parallel.h"

namespace tierserve {
namespace {

constexpr int kTile = 8;        // query rows per task
constexpr int kMaxGroup = 16;   // query heads per KV head
constexpr int kMaxDim = 256;    // head_dim
constexpr int kMaxBlock = 64;   // block_size
constexpr int kLaneRows = 16;   // segments of at least this many rows go by lanes (run_lanes)
constexpr int kLaneQueries = 3 * VL;  // queries (rows x group) of one run_lanes task, at most

struct Task {
  int32_t row0, rows, table, ctx0, head;
  bool lanes;  // run_lanes, else run_rows
};

struct Geometry {
  int64_t heads, kv_heads, group, dim, blocks, block_size, table_width;
  int64_t q_row_stride, out_row_stride;
  float scale;
};

// Keys of one step of the online softmax, at positions fixed by the context (multiples of KP):
// both kernels below update a query's running max, sum and accumulator once per such chunk.
constexpr int KP = VL >= 16 ? 8 : 4;

// One query's arithmetic, which both kernels below follow operation for operation, so that a
// row's output does not depend on which kernel ran it (how many rows its segment had: a decode,
// a verification, a fresh prompt, a chunk after a cached prefix) nor on its tile:
//   score of key p: s = 0; s = fma(k[p][d], q[d] * scale, s) for d = 0, 1, ... (in order);
//   per chunk of KP keys (keys past the row's context: -inf): mx = max(m, s...);
//   alpha = exp(m - mx); m = mx; l = l * alpha; l += e_p (p in order), e_p = exp(s_p - mx);
//   acc = acc * alpha; acc = fma(e_p, v[p], acc) (p in order); output acc * (1 / l).
// A chunk past the row's context changes nothing (alpha = 1, e = 0), so a kernel may skip it.
// The build compiles with -ffp-contract=off: every fused multiply-add is an explicit vfma.

// Scores of queries [j0, j0 + JT) against 4 * VL keys, VL per K tile (tile[kv][d * VL + u]),
// each the FMA chain over d in order: JT x 4 accumulators in registers.
template <int D, int JT, int SB>
inline void score_keys(const float* qs, const float* const* tile, float* sc, int j0) {
  constexpr int NKV = SB / VL;
  vf s[JT][NKV];
  for (int jj = 0; jj < JT; ++jj)
    for (int kv = 0; kv < NKV; ++kv) s[jj][kv] = vf{};
  for (int d = 0; d < D; ++d) {
    vf kd[NKV];
    for (int kv = 0; kv < NKV; ++kv) kd[kv] = vload(tile[kv] + d * VL);
    for (int jj = 0; jj < JT; ++jj) {
      const vf qd = vbroadcast(qs[(j0 + jj) * D + d]);
      for (int kv = 0; kv < NKV; ++kv) s[jj][kv] = vfma(kd[kv], qd, s[jj][kv]);
    }
  }
  for (int jj = 0; jj < JT; ++jj)
    for (int kv = 0; kv < NKV; ++kv) vstore(sc + (j0 + jj) * SB + kv * VL, s[jj][kv]);
}

// A segment of few rows (decodes, speculative verification), by keys across lanes: one FMA
// scores a K tile's VL keys against one query in the order above (the tiles of 4 * VL
// positions at a time, for every query of the task: rows x query heads of the group, so the
// keys are read once for all of them). Then per chunk of KP keys each query's softmax step and
// its weighted values, its accumulator in registers.
template <int DV, class T>  // head_dim / VL, the cache's element
void run_rows(const Task& t, const Geometry& g, const float* q, const T* kc, const T* vc,
              const int32_t* tables, float* out) {
  constexpr int D = DV * VL, SB = 4 * VL, NKV = SB / VL, JT = VL >= 16 ? 4 : 2;
  constexpr int NQ = kTile * kMaxGroup;
  const int G = static_cast<int>(g.group), nq = t.rows * G;
  alignas(64) float qs[NQ * D];         // scaled queries
  alignas(64) float kw[D * SB];         // a 16-bit cache's K tiles of this span, widened
  alignas(64) float sc[NQ * SB + VL];   // their scores, per query (+ a vector's overrun)
  vf acc[NQ][DV];
  float m_run[NQ], l_run[NQ];
  int64_t lim[NQ];
  for (int j = 0; j < nq; ++j) {
    const int i = j / G, h = j % G;
    const float* qp = q + (t.row0 + i) * g.q_row_stride + (t.head * g.group + h) * D;
    for (int d = 0; d < D; ++d) qs[j * D + d] = qp[d] * g.scale;
    for (int d = 0; d < DV; ++d) acc[j][d] = vf{};
    m_run[j] = -std::numeric_limits<float>::infinity();
    l_run[j] = 0.f;
    lim[j] = t.ctx0 + i;  // keys [0, lim) are visible
  }
  const int64_t bs = g.block_size;
  const int64_t ctx_max = t.ctx0 + t.rows - 1;
  const int32_t* table = tables + static_cast<int64_t>(t.table) * g.table_width;
  const T* kh = kc + t.head * g.blocks * bs * D;
  const T* vh = vc + t.head * g.blocks * bs * D;
  const vf neg_inf = vbroadcast(-std::numeric_limits<float>::infinity());
  vf iota;
  for (int u = 0; u < VL; ++u) iota[u] = static_cast<float>(u);
  for (int64_t s0 = 0; s0 < ctx_max; s0 += SB) {
    const int64_t n_sb = std::min<int64_t>(SB, ctx_max - s0);
    const int nvec = static_cast<int>((n_sb + VL - 1) / VL);
    const float* tile[NKV];
    for (int kv = 0; kv < NKV; ++kv) {  // a tile lies in one cache block (bs % VL == 0)
      if (kv >= nvec) {  // past the context: the last tile again, scored and masked
        tile[kv] = tile[nvec - 1];
        continue;
      }
      const int64_t p = s0 + kv * VL;
      const T* kb = kh + static_cast<int64_t>(table[p / bs]) * bs * D + (p % bs) * D;
      if constexpr (std::is_same_v<T, float>) {
        tile[kv] = kb;
      } else {
        for (int i = 0; i < D * VL; i += VL) vstore(kw + kv * D * VL + i, kv_load(kb + i));
        tile[kv] = kw + kv * D * VL;
      }
    }
    // JT queries at a time, the rest together (a decode of a 3-head group: all 3 at once, so
    // that 12 independent chains hide the FMA latency)
    int j0 = 0;
    for (; j0 + JT <= nq; j0 += JT) score_keys<D, JT, SB>(qs, tile, sc, j0);
    switch (nq - j0) {
      case 1: score_keys<D, 1, SB>(qs, tile, sc, j0); break;
      case 2: score_keys<D, 2, SB>(qs, tile, sc, j0); break;
      case 3: score_keys<D, 3, SB>(qs, tile, sc, j0); break;
      default: break;
    }
    for (int64_t c0 = 0; c0 < n_sb; c0 += KP) {
      const int64_t pos0 = s0 + c0;
      const int kp = static_cast<int>(std::min<int64_t>(KP, n_sb - c0));
      const T* vrow[KP];
      for (int p = 0; p < kp; ++p) {
        const int64_t pos = pos0 + p;
        vrow[p] = vh + (static_cast<int64_t>(table[pos / bs]) * bs + pos % bs) * D;
      }
      const vf posv = iota + static_cast<float>(pos0);
      for (int j = 0; j < nq; ++j) {
        if (pos0 >= lim[j]) continue;  // past this row's context: no change
        const int n = static_cast<int>(std::min<int64_t>(kp, lim[j] - pos0));  // visible keys
        const vf sv = vload(sc + j * SB + c0);
        const vf e = posv < static_cast<float>(pos0 + n) ? sv : neg_inf;
        float mx = m_run[j];
        for (int p = 0; p < KP; ++p) mx = e[p] > mx ? e[p] : mx;
        const float alpha = vexp_nonpos(vbroadcast(m_run[j]) - mx)[0];
        m_run[j] = mx;
        const vf ev = vexp_nonpos(e - mx);
        float lv = l_run[j] * alpha;
        for (int p = 0; p < KP; ++p) lv += ev[p];
        l_run[j] = lv;
        vf a[DV];
        for (int d = 0; d < DV; ++d) a[d] = acc[j][d] * alpha;
        for (int p = 0; p < n; ++p) {
          const vf w = vbroadcast(ev[p]);
          for (int d = 0; d < DV; ++d) a[d] = vfma(w, kv_load(vrow[p] + d * VL), a[d]);
        }
        for (int d = 0; d < DV; ++d) acc[j][d] = a[d];
      }
    }
  }
  for (int j = 0; j < nq; ++j) {
    const int i = j / G, h = j % G;
    float* op = out + (t.row0 + i) * g.out_row_stride + (t.head * g.group + h) * D;
    const float inv = 1.f / l_run[j];
    for (int d = 0; d < DV; ++d) vstore(op + d * VL, acc[j][d] * inv);
  }
}


// A segment of many rows (a prompt chunk): the task's queries (row x query head of the group)
// lie across vector lanes, QL vectors of them, and the keys go one at a time: each FMA scores
// one key against VL queries, the online softmax runs per lane with no horizontal reduction,
// and the weighted values are summed per query from the stored probabilities. Keys are taken
// KP at a time at positions fixed by the context (not by the task), and each lane's arithmetic
// is the same whatever shares its task, so a row's result does not depend on how its prompt
// was chunked or tiled. One-row segments (decodes) and short ones (speculative verification)
// go by run_rows: a decode's few queries would fill few lanes.
template <int DV, int QL, class T>
void run_lanes(const Task& t, const Geometry& g, const float* q, const T* kc, const T* vc,
               const int32_t* tables, float* out) {
  constexpr int D = DV * VL, NQ = QL * VL, JB = 4;
  const int nq = t.rows * static_cast<int>(g.group);
  alignas(64) float qt[D * NQ];   // scaled queries, transposed: qt[d * NQ + j]
  alignas(64) float acc[NQ * D];  // acc[j * D + d]
  alignas(64) float pr[KP * NQ];  // this chunk's probabilities: pr[p * NQ + j]
  alignas(64) float al[NQ], lim[NQ], lsum[NQ];
  for (int j = 0; j < NQ; ++j) {
    const bool real = j < nq;
    const int i = real ? j / static_cast<int>(g.group) : 0, h = real ? j % static_cast<int>(g.group) : 0;
    const float* qp = q + (t.row0 + i) * g.q_row_stride + (t.head * g.group + h) * D;
    for (int d = 0; d < D; ++d) qt[d * NQ + j] = real ? qp[d] * g.scale : 0.f;
    lim[j] = real ? static_cast<float>(t.ctx0 + i) : 3.0e38f;  // keys [0, lim) are visible
  }
  std::fill(acc, acc + NQ * D, 0.f);
  vf m[QL], l[QL], limv[QL];
  for (int v = 0; v < QL; ++v) {
    m[v] = vbroadcast(-std::numeric_limits<float>::infinity());
    l[v] = vf{};
    limv[v] = vload(lim + v * VL);
  }
  const int64_t bs = g.block_size, ctx_max = t.ctx0 + t.rows - 1;
  const int32_t* table = tables + static_cast<int64_t>(t.table) * g.table_width;
  const T* kh = kc + t.head * g.blocks * bs * D;
  const T* vh = vc + t.head * g.blocks * bs * D;
  const int jmax = (nq + JB - 1) / JB * JB;
  alignas(64) float kw[D * VL];  // a 16-bit cache's K tile of this chunk, widened once
  for (int64_t p0 = 0; p0 < ctx_max; p0 += bs) {
    const int64_t blk = table[p0 / bs];
    const T* kbt = kh + blk * bs * D;
    const T* vb = vh + blk * bs * D;
    const int64_t n_block = std::min(bs, ctx_max - p0);
    const float* kt = nullptr;
    for (int64_t c0 = 0; c0 < n_block; c0 += KP) {
      const int kp = static_cast<int>(std::min<int64_t>(KP, n_block - c0));
      // keys [c0, c0 + KP) as float32, in their K tile (kt[d * VL + u]; those past kp lie
      // inside the tile: read and masked)
      if (c0 % VL == 0) {
        const T* tp = kbt + c0 * D;  // the tile of keys [c0, c0 + VL)
        if constexpr (std::is_same_v<T, float>) {
          kt = tp;
        } else {
          for (int i = 0; i < D * VL; i += VL) vstore(kw + i, kv_load(tp + i));
          kt = kw;
        }
      }
      const float* kb = kt + c0 % VL;
      vf s[KP][QL];
      for (int p = 0; p < KP; ++p)
        for (int v = 0; v < QL; ++v) s[p][v] = vf{};
      for (int d = 0; d < D; ++d) {  // keys past kp are read inside the block and masked below
        vf qd[QL];
        for (int v = 0; v < QL; ++v) qd[v] = vload(qt + d * NQ + v * VL);
        for (int p = 0; p < KP; ++p) {
          const vf kd = vbroadcast(kb[d * VL + p]);
          for (int v = 0; v < QL; ++v) s[p][v] = vfma(kd, qd[v], s[p][v]);
        }
      }
      const vf neg_inf = vbroadcast(-std::numeric_limits<float>::infinity());
      for (int v = 0; v < QL; ++v) {
        vf mx = m[v];
        for (int p = 0; p < KP; ++p) {
          const vf pos = vbroadcast(static_cast<float>(p0 + c0 + p));
          s[p][v] = (p < kp) ? (pos < limv[v] ? s[p][v] : neg_inf) : neg_inf;
          mx = vmax(mx, s[p][v]);
        }
        const vf alpha = vexp_nonpos(m[v] - mx);  // 0 on the first chunk (-inf - mx)
        m[v] = mx;
        vf lv = l[v] * alpha;
        for (int p = 0; p < KP; ++p) {
          const vf e = vexp_nonpos(s[p][v] - mx);
          lv += e;
          vstore(pr + p * NQ + v * VL, e);
        }
        l[v] = lv;
        vstore(al + v * VL, alpha);
      }
      for (int j = 0; j < jmax; j += JB) {
        vf a[JB][DV];
        for (int b = 0; b < JB; ++b)
          for (int dv = 0; dv < DV; ++dv) a[b][dv] = vload(acc + (j + b) * D + dv * VL) * al[j + b];
        for (int p = 0; p < kp; ++p) {
          vf vv[DV];
          for (int dv = 0; dv < DV; ++dv) vv[dv] = kv_load(vb + (c0 + p) * D + dv * VL);
          for (int b = 0; b < JB; ++b) {
            const vf w = vbroadcast(pr[p * NQ + j + b]);
            for (int dv = 0; dv < DV; ++dv) a[b][dv] = vfma(w, vv[dv], a[b][dv]);
          }
        }
        for (int b = 0; b < JB; ++b)
          for (int dv = 0; dv < DV; ++dv) vstore(acc + (j + b) * D + dv * VL, a[b][dv]);
      }
    }
  }
  for (int v = 0; v < QL; ++v) vstore(lsum + v * VL, l[v]);
  for (int j = 0; j < nq; ++j) {
    const int i = j / static_cast<int>(g.group), h = j % static_cast<int>(g.group);
    float* op = out + (t.row0 + i) * g.out_row_stride + (t.head * g.group + h) * D;
    const float inv = 1.f / lsum[j];
    for (int dv = 0; dv < DV; ++dv) vstore(op + dv * VL, vload(acc + j * D + dv * VL) * inv);
  }
}


template <int DV, class T>
void run_lanes_ql(int ql, const Task& t, const Geometry& g, const float* q, const T* kc,
                  const T* vc, const int32_t* tables, float* out) {
  if (ql <= 1) return run_lanes<DV, 1>(t, g, q, kc, vc, tables, out);
  if (ql == 2) return run_lanes<DV, 2>(t, g, q, kc, vc, tables, out);
  return run_lanes<DV, 3>(t, g, q, kc, vc, tables, out);
}

template <class T>
void run_one_task(int64_t dv, const Task& t, const Geometry& g, const float* q, const T* kc,
                  const T* vc, const int32_t* tables, float* out) {
  if (t.lanes) {
    const int ql = (t.rows * static_cast<int>(g.group) + VL - 1) / VL;
    switch (dv) {
#define TS_CASE(n) \
  case n: return run_lanes_ql<n>(ql, t, g, q, kc, vc, tables, out);
      TS_CASE(1) TS_CASE(2) TS_CASE(4) TS_CASE(6) TS_CASE(8) TS_CASE(16) TS_CASE(32)
#undef TS_CASE
    }
    return;
  }
  switch (dv) {
#define TS_CASE(n) \
  case n: return run_rows<n>(t, g, q, kc, vc, tables, out);
    TS_CASE(1) TS_CASE(2) TS_CASE(4) TS_CASE(6) TS_CASE(8) TS_CASE(16) TS_CASE(32)
#undef TS_CASE
  }
}

template <class T>
void run_tasks(const std::vector<Task>& tasks, int64_t dv, const Geometry& g, const float* q,
               const at::Tensor& k_cache, const at::Tensor& v_cache, const int32_t* tables,
               float* out) {
  const T* kc = static_cast<const T*>(k_cache.data_ptr());
  const T* vc = static_cast<const T*>(v_cache.data_ptr());
  claim_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t t0, int64_t t1) {
    for (int64_t i = t0; i < t1; ++i) run_one_task<T>(dv, tasks[i], g, q, kc, vc, tables, out);
  });
}

}  // namespace

// Whether the kernel handles this geometry (else the caller uses the PyTorch path).
bool supported(int64_t group, int64_t head_dim, int64_t block_size) {
  const int64_t dv = head_dim / VL;
  const bool dv_ok = dv == 1 || dv == 2 || dv == 4 || dv == 6 || dv == 8 || dv == 16 || dv == 32;
  return group >= 1 && group <= kMaxGroup && head_dim % VL == 0 && head_dim <= kMaxDim && dv_ok &&
         block_size % VL == 0 && block_size <= kMaxBlock;
}

// q: [T, H, D] (rows may be strided); caches: [H_kv, blocks, block_size, D]; tables: [S, W]
// int32; segments: [n, 4] int32 rows (row0, rows, table, ctx0); out: [T, H, D] contiguous,
// written only at the segments' rows.
void paged_attention_into(const at::Tensor& q, const at::Tensor& k_cache,
                          const at::Tensor& v_cache, const at::Tensor& tables,
                          const at::Tensor& segments, double scale, at::Tensor& out) {
  TORCH_CHECK(q.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat,
              "paged_attention: float32 queries and output expected");
  TORCH_CHECK(kv_dtype_supported(k_cache.scalar_type()) &&
                  v_cache.scalar_type() == k_cache.scalar_type(),
              "paged_attention: float32, float16 or bfloat16 caches (both alike) expected, got ",
              k_cache.scalar_type(), " and ", v_cache.scalar_type());
  TORCH_CHECK(tables.scalar_type() == at::kInt && segments.scalar_type() == at::kInt,
              "paged_attention: int32 tables and segments expected");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && tables.is_contiguous() &&
                  segments.is_contiguous() && out.is_contiguous(),
              "paged_attention: contiguous caches, tables, segments and out expected");
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && segments.dim() == 2 && segments.size(1) == 4,
              "paged_attention: bad ranks");
  Geometry g;
  g.heads = q.size(1);
  g.dim = q.size(2);
  g.kv_heads = k_cache.size(0);
  g.blocks = k_cache.size(1);
  g.block_size = k_cache.size(2);
  g.table_width = tables.size(1);
  g.scale = static_cast<float>(scale);
  TORCH_CHECK(q.stride(2) == 1 && q.stride(1) == g.dim, "paged_attention: q heads must be dense");
  TORCH_CHECK(k_cache.size(3) == g.dim && g.heads % g.kv_heads == 0, "paged_attention: shapes");
  g.group = g.heads / g.kv_heads;
  TORCH_CHECK(supported(g.group, g.dim, g.block_size), "paged_attention: unsupported geometry");
  g.q_row_stride = q.stride(0);
  g.out_row_stride = out.stride(0);

  const int32_t* seg = segments.data_ptr<int32_t>();
  const int64_t lane_rows = std::max<int64_t>(1, kLaneQueries / g.group);
  std::vector<Task> tasks;
  for (int64_t s = 0; s < segments.size(0); ++s) {
    const int32_t row0 = seg[4 * s], rows = seg[4 * s + 1], table = seg[4 * s + 2],
                  ctx0 = seg[4 * s + 3];
    TORCH_CHECK(rows >= 0 && ctx0 >= 1 && table >= 0 && table < tables.size(0) &&
                    row0 + rows <= q.size(0) &&
                    (ctx0 + rows - 1 + g.block_size - 1) / g.block_size <= g.table_width,
                "paged_attention: segment ", s, " out of range");
    // A long segment goes by queries across lanes (run_lanes: up to kLaneQueries queries a
    // task), a short one by keys across lanes (run_rows).
    const bool lanes = rows >= kLaneRows;
    const int32_t tile = lanes ? static_cast<int32_t>(lane_rows) : kTile;
    for (int32_t r = 0; r < rows; r += tile)
      for (int32_t h = 0; h < g.kv_heads; ++h)
        tasks.push_back({row0 + r, std::min<int32_t>(tile, rows - r), table, ctx0 + r, h, lanes});
  }
  const float* qp = q.data_ptr<float>();
  const int32_t* tp = tables.data_ptr<int32_t>();
  float* op = out.data_ptr<float>();
  const int64_t dv = g.dim / VL;
  switch (k_cache.scalar_type()) {
    case at::kHalf: return run_tasks<KvHalf>(tasks, dv, g, qp, k_cache, v_cache, tp, op);
    case at::kBFloat16: return run_tasks<KvBf16>(tasks, dv, g, qp, k_cache, v_cache, tp, op);
    default: return run_tasks<float>(tasks, dv, g, qp, k_cache, v_cache, tp, op);
  }
}

}  // namespace tierserve
