// parallel_map: independent CPU work items on a few threads, results in item order, so that a
// caller summing them gets the same figures whatever the thread count.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace hisparse {

/// Runs work(i) for i in [0, count) on up to `threads` threads (0: every hardware thread) and
/// returns the results in index order. The first exception is rethrown after every thread has
/// stopped; items not yet started when it was thrown are not run.
template <class Work>
auto parallel_map(int count, int threads, Work work) {
  using Result = decltype(work(0));
  std::vector<Result> results(static_cast<std::size_t>(std::max(count, 0)));
  const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
  const auto workers = static_cast<int>(std::min<std::size_t>(
      threads > 0 ? static_cast<unsigned>(threads) : hardware, results.size()));
  std::atomic<int> next{0};
  std::exception_ptr failure;
  std::mutex failure_lock;
  const auto run = [&] {
    for (int i; (i = next.fetch_add(1)) < count;) {
      try {
        results[static_cast<std::size_t>(i)] = work(i);
      } catch (...) {
        const std::lock_guard<std::mutex> hold(failure_lock);
        if (!failure) failure = std::current_exception();
        next = count;  // stop handing out items
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < workers; ++t) pool.emplace_back(run);
  run();
  for (auto& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
  return results;
}

}  // namespace hisparse
