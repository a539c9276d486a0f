// The kernels' thread pool (parallel.h): workers that claim chunks of the current region from
// one atomic word, and a caller that never waits for a worker that has not claimed anything.
//
// The word packs the region's generation (16 bits), its chunk count and the next unclaimed
// chunk (24 bits each): a worker claims by compare-and-swap against the generation it woke for,
// so a late worker can never take a chunk of a later region. The region's function is read
// only after a successful claim, while the caller still waits for that chunk.
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "parallel.h"

namespace tierserve {
namespace {

constexpr uint64_t kMask24 = (1u << 24) - 1;
constexpr auto kWorkerSpin = std::chrono::microseconds(60);  // then sleep until woken

struct Pool {
  std::atomic<uint64_t> word{0};  // generation << 48 | chunks << 24 | next
  std::atomic<int64_t> done{0};   // chunks finished by workers
  ChunkFn fn = nullptr;
  void* ctx = nullptr;
  std::mutex error_mu;
  std::exception_ptr error;
  std::mutex submit;  // one region at a time; other callers run theirs alone
  std::mutex sleep_mu;
  std::condition_variable wake;
  std::atomic<int> sleepers{0};
  std::atomic<int> threads{0};  // 0: not set yet
  int workers = 0;              // started (under `submit`)
  uint32_t generation = 0;      // of the last region (under `submit`)
};

std::atomic<Pool*> the_pool{nullptr};

Pool& pool() {
  Pool* p = the_pool.load(std::memory_order_acquire);
  if (p) return *p;
  static std::once_flag once;
  std::call_once(once, [] {
    the_pool.store(new Pool, std::memory_order_release);  // never freed: workers outlive main
    // A forked child has none of the parent's workers and maybe a mutex held by one of them:
    // it starts from a fresh pool.
    pthread_atfork(nullptr, nullptr, [] { the_pool.store(new Pool, std::memory_order_release); });
  });
  return *the_pool.load(std::memory_order_acquire);
}

uint32_t generation_of(uint64_t w) { return static_cast<uint32_t>(w >> 48); }

// The next chunk of region `gen`, or false when it has none left (or is over).
bool claim(Pool& p, uint32_t gen, int64_t& chunk) {
  uint64_t w = p.word.load(std::memory_order_acquire);
  for (;;) {
    if (generation_of(w) != gen) return false;
    const uint64_t next = w & kMask24, chunks = (w >> 24) & kMask24;
    if (next >= chunks) return false;
    if (p.word.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel)) {
      chunk = static_cast<int64_t>(next);
      return true;
    }
  }
}

void run_one(Pool& p, int64_t chunk) {
  try {
    p.fn(p.ctx, chunk);
  } catch (...) {
    std::lock_guard<std::mutex> lk(p.error_mu);
    if (!p.error) p.error = std::current_exception();
  }
}

void worker(Pool& p) {
  uint32_t seen = generation_of(p.word.load(std::memory_order_acquire));
  for (;;) {
    auto until = std::chrono::steady_clock::now() + kWorkerSpin;
    uint32_t gen = generation_of(p.word.load(std::memory_order_acquire));
    for (int i = 0; gen == seen; ++i) {
      _mm_pause();
      if ((i & 63) == 63 && std::chrono::steady_clock::now() > until) {
        std::unique_lock<std::mutex> lk(p.sleep_mu);
        p.sleepers.fetch_add(1);
        p.wake.wait(lk, [&] { return generation_of(p.word.load()) != seen; });
        p.sleepers.fetch_sub(1);
      }
      gen = generation_of(p.word.load(std::memory_order_acquire));
    }
    seen = gen;
    int64_t chunk;
    while (claim(p, gen, chunk)) {
      run_one(p, chunk);
      p.done.fetch_add(1, std::memory_order_release);
    }
  }
}

}  // namespace

void set_kernel_threads(int threads) { pool().threads.store(std::max(1, threads)); }

int kernel_threads() {
  Pool& p = pool();
  int t = p.threads.load(std::memory_order_relaxed);
  if (t == 0) {
    t = std::max(1, at::get_num_threads());
    int expected = 0;
    if (!p.threads.compare_exchange_strong(expected, t)) t = expected;
  }
  return t;
}

void run_chunks(int64_t chunks, ChunkFn fn, void* ctx) {
  Pool& p = pool();
  const int threads = kernel_threads();
  std::unique_lock<std::mutex> submit(p.submit, std::try_to_lock);
  if (chunks <= 1 || threads <= 1 || chunks > static_cast<int64_t>(kMask24) || !submit) {
    for (int64_t c = 0; c < chunks; ++c) fn(ctx, c);
    return;
  }
  for (; p.workers < threads - 1; ++p.workers) std::thread([&p] { worker(p); }).detach();
  p.fn = fn;
  p.ctx = ctx;
  p.error = nullptr;
  p.done.store(0, std::memory_order_relaxed);
  p.generation = (p.generation + 1) & 0xffff;
  const uint32_t gen = p.generation;
  p.word.store(static_cast<uint64_t>(gen) << 48 | static_cast<uint64_t>(chunks) << 24);
  if (p.sleepers.load() > 0) {
    std::lock_guard<std::mutex> lk(p.sleep_mu);
    p.wake.notify_all();
  }
  int64_t mine = 0, chunk;
  while (claim(p, gen, chunk)) {
    run_one(p, chunk);
    ++mine;
  }
  // Only chunks a worker claimed are left: wait for them (a worker descheduled mid-chunk is
  // the one wait that remains; chunks are small).
  for (int i = 0; p.done.load(std::memory_order_acquire) + mine < chunks; ++i) {
    _mm_pause();
    if ((i & 1023) == 1023) std::this_thread::yield();
  }
  if (p.error) std::rethrow_exception(p.error);
}

}  // namespace tierserve
