// The plane-scan tests' fixture: one stream of random bf16 keys in a PlaneStore, random queries
// and channel variances, and the bisection planner's depths for a budget, as PlaneScanArgs.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtypes.hpp"
#include "core/rng.hpp"
#include "fathom/plane_store.hpp"
#include "kernels/fathom/depth_plan.hpp"
#include "kernels/fathom/plane_scan.hpp"

namespace hisparse::test {

namespace kf = kernels::fathom;

inline std::vector<std::uint16_t> random_keys(std::size_t count, int d, std::uint64_t seed) {
  std::vector<std::uint16_t> k(count);
  for (std::size_t i = 0; i < count; ++i)
    k[i] = float_to_bf16(random_normal(seed, i) *
                         (0.2f + static_cast<float>(i % static_cast<std::size_t>(d)) / 16.0f));
  return k;
}

struct ScanFixture {
  int d = 0, heads = 0;
  std::int64_t n = 0;
  fathom::PlaneStore store;
  std::vector<float> q, var;
  std::vector<std::uint8_t> depths;
  kf::PlaneScanArgs args;
  ScanFixture(int d_, int heads_, std::int64_t n_, int budget, std::uint64_t seed,
              fathom::PlaneLayoutKind kind = fathom::PlaneLayoutKind::hbm)
      : d(d_), heads(heads_), n(n_), store(Backend::cpu, kind, 1, d_, n_) {
    const auto keys = random_keys(static_cast<std::size_t>(n) * d, d, seed);
    store.append(0, 1, keys.data(), d, 0, n);
    q.resize(static_cast<std::size_t>(heads) * d);
    var.resize(d);
    Rng rng(seed + 1);
    for (auto& x : q) x = rng.normal();
    for (auto& v : var) v = std::pow(10.0f, -3.0f * rng.uniform());
    depths.resize(d);
    kf::DepthPlanArgs p;
    p.queries = q.data();
    p.variances = var.data();
    p.streams = 1;
    p.heads = heads;
    p.channels = d;
    p.budget = budget;
    p.depths = depths.data();
    kf::depth_plan_bisection_ref(p);
    args.words = store.words();
    args.scales = store.scales();
    args.layout = store.layout();
    args.queries = q.data();
    args.depths = depths.data();
    args.streams = 1;
    args.heads = heads;
  }
  /// Every other depth-1 channel becomes a sign read (same planes, so the same budget), leaving
  /// channels of both kinds.
  void use_sign_reads() {
    int ones = 0;
    for (auto& t : depths)
      if (t == 1 && ones++ % 2 == 0) t = kf::kSignRead;
    ASSERT_GE(ones, 2) << "the plan has too few depth-1 channels to test sign reads";
  }
};

}  // namespace hisparse::test
