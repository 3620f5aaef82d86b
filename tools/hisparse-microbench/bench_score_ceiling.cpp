// fathom_score_ceiling/<work>[/warps:4]/slots:S/context:N/batch:B: the scoring-ceiling probe
// (score_ceiling_probe.hpp) over batch x 8 streams of N tokens in the HBM layout, S channels read
// at depth 1 (S plane bits per token, like a budget of S spread over S channels; the benchmark
// depths of budget 48 give about 40 active channels and 48 units). Work `score` is the HBM scan's
// arithmetic with nothing else; `unscaled` drops the per-block multipliers, `mask_only` also the
// shift of each code byte (one mask per 4 bytes, the cheapest expansion there is), `expand_only`
// the MMAs (the code bytes are summed instead), `stage_only` everything but the staging; `warps:4`
// runs 4-warp blocks whose warps score 4 blocks each instead of 2. Counters as
// fathom_scan's: us per call, bytes read (plane-0 words and scales of the S channels), GB/s and
// the fraction of the HBM copy ceiling. The first call's counts are checked against the CPU twin
// (every stream holds the same random planes, so one stream's twin serves all). L2 is flushed
// before every timed call. Synthetic planes, weights and threshold.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.hpp"
#include "microbench_util.hpp"
#include "score_ceiling_probe.hpp"

namespace hisparse::microbench {
namespace {
namespace kf = kernels::fathom;

struct CeilingCase {
  CeilingWork work;
  int slots;
  std::int64_t context;
  int batch;
  int warps = 8;  ///< ScoreCeilingArgs::warps
};

#if HISPARSE_WITH_CUDA
void run_ceiling(benchmark::State& state, const CeilingCase& c) {
  constexpr int kKvHeads = 8, kChannels = 128;
  const int streams = c.batch * kKvHeads;
  kf::PlaneLayout layout;
  layout.kind = kf::PlaneLayoutKind::hbm;
  layout.channels = kChannels;
  layout.capacity_blocks = c.context / kf::kBlockTokens;
  const auto words_per = static_cast<std::size_t>(layout.words_per_stream());
  const auto scales_per = static_cast<std::size_t>(layout.scales_per_stream());
  std::vector<std::uint64_t> words(words_per);
  std::vector<std::uint16_t> scales(scales_per);
  random_planes(words, scales);
  std::vector<std::int8_t> weights(static_cast<std::size_t>(kCeilingHeads) * c.slots);
  Rng rng(2026);
  for (auto& w : weights)
    w = static_cast<std::int8_t>(static_cast<int>(rng.next_bits() % 255) - 127);

  auto d_words = Buffer<std::uint64_t>::device(words_per * streams, Backend::cuda, "HBM planes");
  auto d_scales = Buffer<std::uint16_t>::device(scales_per * streams, Backend::cuda, "HBM scales");
  for (int s = 0; s < streams; ++s) {
    copy_bytes(d_words.device_data() + s * words_per, words.data(), words_per * 8, Backend::cuda);
    copy_bytes(d_scales.device_data() + s * scales_per, scales.data(), scales_per * 2,
               Backend::cuda);
  }
  auto d_weights = device_copy(weights, "weights");
  auto d_counts = Buffer<std::int32_t>::device(streams, Backend::cuda, "counts");

  ScoreCeilingArgs a;
  a.words = d_words.device_data();
  a.scales = d_scales.device_data();
  a.layout = layout;
  a.weights = d_weights.device_data();
  a.slots = c.slots;
  a.streams = streams;
  a.tokens = c.context;
  // About 1% of the scores: a slot's term has a standard deviation near 4,000 (weights uniform
  // in +-127, code bytes 8 x bit x multipliers 1..16).
  a.threshold = static_cast<int>(9300.0 * std::sqrt(static_cast<double>(c.slots)));
  a.counts = d_counts.device_data();
  a.work = c.work;
  a.warps = c.warps;
  const int superblocks = static_cast<int>(c.context / (kf::kSuperblockBlocks * kf::kBlockTokens));
  const int resident = score_ceiling_resident_blocks(a);
  const int chunks =
      std::max(1, std::min(superblocks, (4 * resident * sm_count() + streams - 1) / streams));

  Stream stream(Backend::cuda);
  HISPARSE_CUDA_CHECK(cudaMemsetAsync(a.counts, 0, streams * 4, stream.native()));
  launch_score_ceiling(a, chunks, stream.native());
  stream.synchronize();
  std::vector<std::int32_t> got(streams), want(1);
  copy_bytes(got.data(), a.counts, got.size() * 4, Backend::cuda);
  ScoreCeilingArgs one = a;
  one.streams = 1;
  score_ceiling_ref(one, words.data(), scales.data(), weights.data(), want.data());
  for (int s = 0; s < streams; ++s)
    if (got[s] != want[0]) {
      state.SkipWithError(
          fmt::format("stream {}: the probe counted {}, its CPU twin {}", s, got[s], want[0])
              .c_str());
      return;
    }

  L2Flusher l2;
  GpuTimer timer(stream);
  const CapturedGraph graph(stream, [&](cudaStream_t s) {
    HISPARSE_CUDA_CHECK(cudaMemsetAsync(a.counts, 0, streams * 4, s));
    launch_score_ceiling(a, chunks, s);
  });
  const double per_call = time_calls(
      state, timer, [&](std::size_t) { l2.flush(stream); },
      [&](std::size_t) { graph.launch(stream); });
  const double bytes = static_cast<double>(streams) * static_cast<double>(c.context) *
                       (c.slots / 8.0 + c.slots * 2.0 / kf::kBlockTokens);
  const double gbps = bytes / per_call / 1e9;
  const double ceiling = hbm_copy_gbps();
  state.counters["us_per_call"] = per_call * 1e6;
  state.counters["read_MB"] = bytes / 1e6;
  state.counters["GBps"] = gbps;
  state.counters["ceiling_fraction"] = gbps / ceiling;
  state.counters["count_per_stream"] = want[0];
  state.SetLabel(
      fmt::format("probe, synthetic planes: {} streams x {} chunks, {} blocks/SM, "
                  "ceiling {:.0f} GB/s (HBM copy)",
                  streams, chunks, resident, ceiling));
}
#endif

void bench_ceiling(benchmark::State& state, [[maybe_unused]] CeilingCase c) {
  guarded(state, "fathom_score_ceiling", [&] { HISPARSE_GPU_ONLY(run_ceiling(state, c)); });
}

bool register_ceiling() {
  const std::pair<CeilingWork, const char*> works[] = {{CeilingWork::score, "score"},
                                                       {CeilingWork::unscaled, "unscaled"},
                                                       {CeilingWork::mask_only, "mask_only"},
                                                       {CeilingWork::expand_only, "expand_only"},
                                                       {CeilingWork::stage_only, "stage_only"}};
  const std::pair<std::int64_t, int> shapes[] = {{131072, 8}, {1048576, 32}};
  for (auto [work, name] : works)
    for (int slots : {48, 128})
      for (auto [context, batch] : shapes)
        register_timed(fmt::format("fathom_score_ceiling/{}/slots:{}/context:{}/batch:{}", name,
                                   slots, context, batch),
                       bench_ceiling, CeilingCase{work, slots, context, batch});
  // 4-warp blocks: each warp scores 4 blocks of a superblock at once (more independent chains).
  for (auto [work, name] : works)
    for (auto [context, batch] : shapes)
      if (work != CeilingWork::stage_only)
        register_timed(fmt::format("fathom_score_ceiling/{}/warps:4/slots:48/context:{}/batch:{}",
                                   name, context, batch),
                       bench_ceiling, CeilingCase{work, 48, context, batch, 4});
  return true;
}

[[maybe_unused]] const bool registered = register_ceiling();

}  // namespace
}  // namespace hisparse::microbench
