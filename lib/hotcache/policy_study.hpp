// The replacement-policy study over recorded selections (`hisparse-bench policies`): which
// hot-buffer size a workload needs and how far LRU, the swap-in's policy, is from Belady's
// optimum. The selections come from this toolkit's own runs (`run --save-selections`, text) or
// from a serving engine's top-k indices dumped as an .npy, so the answer is about the user's
// model and traffic rather than a synthetic workload. CPU only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "hotcache/policies.hpp"

namespace hisparse {

/// One recorded stream (a request's selections at one layer) and the name reports give it.
struct NamedTrace {
  std::string name;  ///< "trace.txt", or "sel.npy[3, 1]" for leading indices 3 and 1 of an .npy
  SelectionTrace trace;
};

/// Reads one file of recorded selections, or every .txt and .npy file of a folder in name order:
/// - text (any name not ending in .npy): one stream, read_selection_trace's format, which carries
///   each step's sequence length;
/// - .npy of int32 or int64 positions shaped [..., steps, top_k]: every index of the leading
///   dimensions is a stream (e.g. [layers, requests, steps, top_k]); negative entries are padding.
///   Step s has sequence length first_seq_len + s (a decode step appends one token), so
///   first_seq_len must be positive for an .npy, and a position at or beyond its step's length is
///   refused (it means first_seq_len is wrong).
/// Throws Error naming the file (and stream, step and entry) and what would fix it; the fix names
/// `first_seq_len_source` (e.g. a command-line flag) when it is not empty.
[[nodiscard]] std::vector<NamedTrace> read_selection_streams(
    const std::filesystem::path& path, std::int64_t first_seq_len,
    std::string_view first_seq_len_source = {});

/// The step that needs the most hot-buffer slots at once for a hot buffer of `hot` slots
/// (largest_step_demand over every stream); slots is 0 when no step needs any.
struct LargestDemand {
  std::int64_t slots = 0;
  std::string stream;
  std::int64_t step = 0;
};
[[nodiscard]] LargestDemand largest_demand(const std::vector<NamedTrace>& streams, int hot);

struct PolicyStudyOptions {
  std::vector<int> hots;                          ///< hot-buffer sizes, each >= largest_demand
  std::string hots_source = "policy study: hot";  ///< what errors about a hot size name
  std::vector<ReplacementPolicy> policies;        ///< in report order
  std::uint64_t seed = 1;                         ///< the random policy's
  std::int64_t warmup_steps = 0;  ///< first steps of each stream, replayed uncounted
  int threads = 0;                ///< 0: every hardware thread; figures do not depend on it
};

/// One (hot, policy): its stats summed over the streams, and each stream's.
struct PolicyStudyCell {
  int hot = 0;
  ReplacementPolicy policy = ReplacementPolicy::lru;
  PolicyStats total;
  std::vector<PolicyStats> per_stream;  ///< in the order of the streams
  /// The stream with the highest miss rate (the first of equals) and that rate.
  [[nodiscard]] std::size_t worst_stream() const noexcept;
};

struct PolicyStudy {
  std::int64_t streams = 0;
  std::int64_t counted_steps = 0;  ///< the longest stream's steps after the warm-up: decode steps
  std::int64_t stream_steps = 0;   ///< counted steps summed over the streams
  std::vector<PolicyStudyCell> cells;  ///< hot-major, then policies in the order given
  /// The cell of (hot, policy); nullptr when the study did not run it.
  [[nodiscard]] const PolicyStudyCell* find(int hot, ReplacementPolicy policy) const noexcept;
};

/// Replays every stream under every (hot, policy). Throws Error for an empty stream list, hot or
/// policy list, a hot size below a step's demand, or a negative warm-up.
[[nodiscard]] PolicyStudy study_policies(const std::vector<NamedTrace>& streams,
                                         const PolicyStudyOptions& options);

}  // namespace hisparse
