// Replacement policies for analysis: how many of a recorded selection trace's rows a hot buffer
// of `hot` slots would have to fetch under LRU (the policy the swap-in implements, with exactly
// its ordering rules), FIFO, random, and Belady's offline optimum (evict the row whose next use
// is farthest away). Runs on the CPU over one (request, layer) trace.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace hisparse {

enum class ReplacementPolicy { lru, fifo, random, belady };

[[nodiscard]] std::string_view name_of(ReplacementPolicy p) noexcept;
/// "lru" | "fifo" | "random" | "belady"; throws Error naming `where` otherwise.
[[nodiscard]] ReplacementPolicy parse_policy(std::string_view name, const std::string& where);

/// One decode step of one (request, layer): the sequence length and the selected positions.
/// Like the swap-in: positions outside [0, seq_len) are ignored, the newest token (seq_len - 1)
/// is always a hit, and steps with seq_len <= hot hit everything and leave the cache unchanged.
struct TraceStep {
  std::int64_t seq_len = 0;
  std::vector<std::int32_t> selected;
};

struct SelectionTrace {
  std::vector<TraceStep> steps;
};

struct PolicyStats {
  ReplacementPolicy policy = ReplacementPolicy::lru;
  std::int64_t hits = 0;    ///< valid selected entries served from the cache
  std::int64_t misses = 0;  ///< rows fetched
  [[nodiscard]] double miss_rate() const noexcept {
    return hits + misses > 0 ? static_cast<double>(misses) / static_cast<double>(hits + misses)
                             : 0.0;
  }
};

/// The slots a step needs at once are its distinct valid positions other than the newest token,
/// or none when seq_len <= hot (every token has its own slot); a hot buffer with fewer slots
/// cannot serve the step. This is the most any step of a trace needs, and the first step that
/// needs it (step -1 when none needs any).
struct StepsDemand {
  std::int64_t slots = 0;
  std::int64_t step = -1;
};
[[nodiscard]] StepsDemand largest_step_demand(const SelectionTrace& trace, int hot);

/// All four policies, in the order lru, fifo, random, belady.
inline constexpr ReplacementPolicy kReplacementPolicies[] = {
    ReplacementPolicy::lru, ReplacementPolicy::fifo, ReplacementPolicy::random,
    ReplacementPolicy::belady};

/// Simulates one policy. The cache starts as HotCache::admit leaves it: slot s holds token s.
/// The first `warmup_steps` steps change the cache but are not counted in the stats (a trace
/// recorded mid-run starts from a cache it did not fill). Throws Error naming the first step
/// that needs more slots at once than `hot` (largest_step_demand).
[[nodiscard]] PolicyStats simulate_policy(ReplacementPolicy policy, const SelectionTrace& trace,
                                          int hot, std::uint64_t seed = 1,
                                          std::int64_t warmup_steps = 0);
/// All four policies, in the order of kReplacementPolicies.
[[nodiscard]] std::vector<PolicyStats> analyse_policies(const SelectionTrace& trace, int hot,
                                                        std::uint64_t seed = 1);

/// Text trace: one step per line, "seq_len: p0 p1 p2 ..."; '#' starts a comment.
[[nodiscard]] SelectionTrace read_selection_trace(const std::filesystem::path& path);
void write_selection_trace(const SelectionTrace& trace, const std::filesystem::path& path);

}  // namespace hisparse
