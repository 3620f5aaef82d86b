#include "hotcache/policy_study.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>

#include "core/error.hpp"
#include "core/parallel.hpp"
#include "model/npy.hpp"

namespace hisparse {
namespace {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// The name of stream `index` of an .npy whose leading dimensions are `lead`: "file[i, j]".
std::string stream_name(const std::string& file, const std::vector<std::int64_t>& lead,
                        std::int64_t index) {
  if (lead.empty()) return file;
  std::vector<std::int64_t> at(lead.size());
  for (std::size_t d = lead.size(); d-- > 0;) {
    at[d] = index % lead[d];
    index /= lead[d];
  }
  return fmt::format("{}[{}]", file, fmt::join(at, ", "));
}

// "give X" naming the flag or key that sets the first sequence length, when there is one.
std::string give(std::string_view source, std::string_view what) {
  return source.empty() ? fmt::format("give {}", what) : fmt::format("give {} {}", source, what);
}

std::vector<NamedTrace> read_index_dump(const std::filesystem::path& path,
                                        std::int64_t first_seq_len, std::string_view source) {
  const std::string file = path.string();
  const NpyArray a = read_npy(path);
  if (!npy_is_integer(a.type))
    throw Error(file, fmt::format("element type '{}' is not an integer type", npy_descr(a.type)),
                "store the selected positions as int32 ('<i4') or int64 ('<i8'), e.g. "
                "numpy.save(path, indices.astype(numpy.int32))");
  if (a.shape.size() < 2)
    throw Error(file,
                fmt::format("shape {} has {} dimension(s); recorded selections are [..., steps, "
                            "top_k]",
                            shape_text(a.shape), a.shape.size()),
                "save at least a steps dimension and a top_k dimension");
  const std::int64_t steps = a.shape[a.shape.size() - 2], top_k = a.shape.back();
  const std::vector<std::int64_t> lead(a.shape.begin(), a.shape.end() - 2);
  std::int64_t streams = 1;
  for (auto d : lead) streams *= d;
  if (steps == 0 || top_k == 0 || streams == 0)
    throw Error(file, fmt::format("shape {} holds no selections", shape_text(a.shape)),
                "save at least one stream of one step with one selected position");
  if (first_seq_len < 1)
    throw Error(file, "an .npy of positions does not say how long the sequences were",
                give(source,
                     "the sequence length at the first recorded step (it grows by one per "
                     "step)"));

  std::vector<NamedTrace> out(static_cast<std::size_t>(streams));
  for (std::int64_t s = 0; s < streams; ++s) {
    NamedTrace& named = out[static_cast<std::size_t>(s)];
    named.name = stream_name(file, lead, s);
    named.trace.steps.resize(static_cast<std::size_t>(steps));
    for (std::int64_t t = 0; t < steps; ++t) {
      TraceStep& step = named.trace.steps[static_cast<std::size_t>(t)];
      step.seq_len = first_seq_len + t;
      step.selected.resize(static_cast<std::size_t>(top_k));
      const auto row = static_cast<std::size_t>((s * steps + t) * top_k);
      for (std::int64_t e = 0; e < top_k; ++e) {
        const std::int64_t pos = a.integer(row + static_cast<std::size_t>(e));
        if (pos >= step.seq_len)
          throw Error(fmt::format("{} step {} entry {}", named.name, t, e),
                      fmt::format("position {} is beyond the step's sequence length {} (the first "
                                  "recorded step's length {} plus {})",
                                  pos, step.seq_len, first_seq_len, t),
                      give(source, fmt::format("the sequence length the first recorded step "
                                               "really had (at least {})",
                                               pos - t + 1)));
        // Every negative entry is padding; int64 positions fit int32 once below seq_len <= 2^31.
        step.selected[static_cast<std::size_t>(e)] = pos < 0 ? -1 : static_cast<std::int32_t>(pos);
      }
    }
  }
  return out;
}

}  // namespace

std::vector<NamedTrace> read_selection_streams(const std::filesystem::path& path,
                                               std::int64_t first_seq_len,
                                               std::string_view first_seq_len_source) {
  if (first_seq_len > std::numeric_limits<std::int32_t>::max())
    throw Error(path.string(),
                fmt::format("a sequence length of {} does not fit the 32-bit positions of a "
                            "selection",
                            first_seq_len),
                "give a length below 2^31");
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(path, ec))
      if (e.is_regular_file(ec) &&
          (e.path().extension() == ".txt" || e.path().extension() == ".npy"))
        files.push_back(e.path());
    if (ec)
      throw Error(path.string(), fmt::format("cannot list the folder ({})", ec.message()),
                  "check its permissions");
    if (files.empty())
      throw Error(path.string(), "the folder holds no .txt or .npy selection files",
                  "point at a folder that run --save-selections wrote, or at the files");
    std::sort(files.begin(), files.end());
    std::vector<NamedTrace> out;
    for (const auto& f : files)
      for (auto& named : read_selection_streams(f, first_seq_len, first_seq_len_source))
        out.push_back(std::move(named));
    return out;
  }
  if (path.extension() == ".npy") return read_index_dump(path, first_seq_len, first_seq_len_source);
  return {NamedTrace{path.string(), read_selection_trace(path)}};
}

LargestDemand largest_demand(const std::vector<NamedTrace>& streams, int hot) {
  LargestDemand largest;
  for (const auto& named : streams)
    if (const StepsDemand d = largest_step_demand(named.trace, hot); d.slots > largest.slots)
      largest = {d.slots, named.name, d.step};
  return largest;
}

std::size_t PolicyStudyCell::worst_stream() const noexcept {
  std::size_t worst = 0;
  for (std::size_t i = 1; i < per_stream.size(); ++i)
    if (per_stream[i].miss_rate() > per_stream[worst].miss_rate()) worst = i;
  return worst;
}

const PolicyStudyCell* PolicyStudy::find(int hot, ReplacementPolicy policy) const noexcept {
  for (const auto& cell : cells)
    if (cell.hot == hot && cell.policy == policy) return &cell;
  return nullptr;
}

PolicyStudy study_policies(const std::vector<NamedTrace>& streams,
                           const PolicyStudyOptions& options) {
  if (streams.empty())
    throw Error("policy study", "no recorded streams were given", "pass at least one trace file");
  if (options.hots.empty() || options.policies.empty())
    throw Error("policy study", "no hot-buffer size or no policy was given",
                "give at least one of each");
  if (options.warmup_steps < 0)
    throw Error("policy study", fmt::format("warm-up of {} steps", options.warmup_steps),
                "give 0 or more warm-up steps");
  for (const int hot : options.hots) {
    if (hot < 1)
      throw Error(options.hots_source, fmt::format("a hot buffer of {} slots", hot),
                  "use at least 1 slot");
    if (const LargestDemand d = largest_demand(streams, hot); d.slots > hot)
      throw Error(options.hots_source,
                  fmt::format("{} slots cannot serve step {} of {}, which needs {} at once (its "
                              "distinct positions other than the newest token)",
                              hot, d.step, d.stream, d.slots),
                  fmt::format("give hot-buffer sizes of at least {}", d.slots));
  }

  PolicyStudy study;
  study.streams = static_cast<std::int64_t>(streams.size());
  for (const auto& named : streams) {
    const auto counted = std::max<std::int64_t>(
        0, static_cast<std::int64_t>(named.trace.steps.size()) - options.warmup_steps);
    study.counted_steps = std::max(study.counted_steps, counted);
    study.stream_steps += counted;
  }
  // Cell c is (hots[c / policies], policies[c % policies]); run i is stream i % streams of cell
  // i / streams.
  const auto per_cell = static_cast<int>(streams.size());
  const auto cells = static_cast<int>(options.hots.size() * options.policies.size());
  const auto hot_of = [&](int c) {
    return options.hots[static_cast<std::size_t>(c) / options.policies.size()];
  };
  const auto policy_of = [&](int c) {
    return options.policies[static_cast<std::size_t>(c) % options.policies.size()];
  };
  const auto runs = parallel_map(cells * per_cell, options.threads, [&](int i) {
    return simulate_policy(policy_of(i / per_cell),
                           streams[static_cast<std::size_t>(i % per_cell)].trace,
                           hot_of(i / per_cell), options.seed, options.warmup_steps);
  });
  for (int c = 0; c < cells; ++c) {
    PolicyStudyCell cell;
    cell.hot = hot_of(c);
    cell.policy = policy_of(c);
    cell.total.policy = cell.policy;
    cell.per_stream.assign(runs.begin() + static_cast<std::ptrdiff_t>(c) * per_cell,
                           runs.begin() + static_cast<std::ptrdiff_t>(c + 1) * per_cell);
    for (const auto& s : cell.per_stream) {
      cell.total.hits += s.hits;
      cell.total.misses += s.misses;
    }
    study.cells.push_back(std::move(cell));
  }
  return study;
}

}  // namespace hisparse
