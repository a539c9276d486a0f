// The kernels' threads: work is split into chunks that threads claim from a shared counter
// (pool.cpp), never into one fixed share per thread. With fixed shares (OpenMP's, behind
// at::parallel_for) every parallel region waits for its slowest thread, so on a small host that
// shares its cores (the server's event loop, a load generator, another process) a thread
// descheduled for a time slice stretches every GEMM by as much: with one busy process on the
// other core of a 2-core machine a 160-token prefill took ~5 s instead of ~0.1 s. Here the
// calling thread claims chunks too and waits only for chunks another thread has already
// started, so a thread that is not running costs nothing: the region runs at the speed of the
// threads that are. Each chunk is computed by one thread in a fixed order, so the result does
// not depend on which thread took it.
#pragma once

#include <algorithm>
#include <cstdint>

namespace tierserve {

using ChunkFn = void (*)(void* ctx, int64_t chunk);

// fn(ctx, c) for every c in [0, chunks), on the calling thread and the pool's workers; returns
// when all are done (rethrowing the first exception a chunk threw). Runs everything on the
// calling thread when the pool is busy with another caller's region, or one thread is set.
void run_chunks(int64_t chunks, ChunkFn fn, void* ctx);

// Threads a region may use, the caller included (at least 1). Default: torch's intra-op count
// on the thread that first runs a region.
void set_kernel_threads(int threads);
int kernel_threads();

// at::parallel_for's contract (f(b, e) over consecutive ranges of [begin, end), each at least
// `grain` long where possible) with claimed chunks: about `per_thread` chunks per thread.
template <class F>
void claim_for(int64_t begin, int64_t end, int64_t grain, const F& f, int64_t per_thread = 4) {
  const int64_t range = end - begin;
  if (range <= 0) return;
  const int threads = kernel_threads();
  const int64_t by_grain = (range + std::max<int64_t>(1, grain) - 1) / std::max<int64_t>(1, grain);
  const int64_t chunks = std::min<int64_t>(by_grain, threads * per_thread);
  if (chunks <= 1 || threads <= 1) {  // one thread: one call over the whole range
    f(begin, end);
    return;
  }
  struct Ctx {
    const F* f;
    int64_t begin, range, chunks;
  } ctx{&f, begin, range, chunks};
  run_chunks(
      chunks,
      [](void* p, int64_t c) {
        const Ctx& x = *static_cast<const Ctx*>(p);
        (*x.f)(x.begin + x.range * c / x.chunks, x.begin + x.range * (c + 1) / x.chunks);
      },
      &ctx);
}

}  // namespace tierserve
