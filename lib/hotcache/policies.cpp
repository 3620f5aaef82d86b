#include "hotcache/policies.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <limits>
#include <set>
#include <unordered_map>
#include <utility>

#include "core/error.hpp"
#include "core/rng.hpp"

namespace hisparse {

std::string_view name_of(ReplacementPolicy p) noexcept {
  switch (p) {
    case ReplacementPolicy::lru:
      return "lru";
    case ReplacementPolicy::fifo:
      return "fifo";
    case ReplacementPolicy::random:
      return "random";
    case ReplacementPolicy::belady:
      return "belady";
  }
  return "?";
}

ReplacementPolicy parse_policy(std::string_view name, const std::string& where) {
  for (auto p : kReplacementPolicies)
    if (name == name_of(p)) return p;
  throw Error(where, fmt::format("unknown replacement policy '{}'", name),
              "use lru, fifo, random or belady");
}

namespace {
/// The distinct positions of a long step that need a slot (valid, not the newest), in selection
/// order, and the count of valid entries.
struct StepDemand {
  std::vector<std::int32_t> tokens;
  std::int64_t valid = 0;
  bool short_step = false;
};

/// A value per token position, -1 when unset: a plain array when the trace's positions are below
/// 2^24 (64 MB at most), else a hash map, so that a trace claiming positions near 2^31 costs
/// memory by what it holds. The simulations' lookups are most of their time; the array makes
/// them 3-4x faster than a hash map.
class TokenIndex {
 public:
  explicit TokenIndex(std::int64_t largest_token) {
    if (largest_token < kDenseTokens)
      dense_.assign(static_cast<std::size_t>(largest_token) + 1, -1);
  }
  [[nodiscard]] std::int32_t get(std::int32_t token) const {
    if (!dense_.empty()) return dense_[static_cast<std::size_t>(token)];
    const auto it = sparse_.find(token);
    return it == sparse_.end() ? -1 : it->second;
  }
  void set(std::int32_t token, std::int32_t value) {
    if (!dense_.empty()) {
      dense_[static_cast<std::size_t>(token)] = value;
    } else if (value < 0) {
      sparse_.erase(token);
    } else {
      sparse_[token] = value;
    }
  }

 private:
  static constexpr std::int64_t kDenseTokens = std::int64_t{1} << 24;
  std::vector<std::int32_t> dense_;
  std::unordered_map<std::int32_t, std::int32_t> sparse_;
};

/// The largest token a simulation of `trace` with `hot` slots can see: the initial tokens
/// 0 .. hot-1 and every valid position.
std::int64_t largest_token(const SelectionTrace& trace, int hot) {
  std::int64_t largest = hot - 1;
  for (const auto& step : trace.steps)
    for (const auto pos : step.selected)
      if (pos >= 0 && pos < step.seq_len) largest = std::max<std::int64_t>(largest, pos);
  return largest;
}

/// Reads steps into their demand, reusing its buffers (one reader per simulation).
class DemandReader {
 public:
  DemandReader(const SelectionTrace& trace, int hot)
      : hot_(hot), seen_(largest_token(trace, hot)) {}
  const StepDemand& read(const TraceStep& step) {
    d_.tokens.clear();
    d_.valid = 0;
    d_.short_step = step.seq_len <= hot_;
    ++stamp_;
    for (const auto pos : step.selected) {
      if (pos < 0 || pos >= step.seq_len) continue;
      ++d_.valid;
      if (d_.short_step || pos == step.seq_len - 1) continue;
      if (seen_.get(pos) != stamp_) {
        seen_.set(pos, stamp_);
        d_.tokens.push_back(pos);
      }
    }
    return d_;
  }
  /// read(), for a simulation: throws when step `index` needs more slots at once than the hot
  /// buffer has, so that no separate validation pass reads every step again.
  const StepDemand& read_servable(const TraceStep& step, std::size_t index) {
    const StepDemand& d = read(step);
    if (d.tokens.size() > static_cast<std::size_t>(hot_))
      throw Error(
          fmt::format("policy analysis: trace step {}", index),
          fmt::format("more distinct selected positions than the {} slots of the hot buffer", hot_),
          "use hot >= top_k");
    return d;
  }

 private:
  int hot_;
  TokenIndex seen_;  ///< the stamp of the last step that demanded each position
  std::int32_t stamp_ = 0;
  StepDemand d_;
};

/// Adds a step's hits and misses to the stats unless the step is a warm-up step.
struct StepCounter {
  PolicyStats stats;
  std::int64_t warmup_steps = 0;
  void add(std::size_t step, const StepDemand& d, std::int64_t misses) {
    if (static_cast<std::int64_t>(step) < warmup_steps) return;
    stats.misses += misses;
    stats.hits += d.valid - misses;
  }
};

/// The slot of every resident token, and the token of every slot; starts as admission leaves
/// the cache (slot s holds token s).
struct Residents {
  TokenIndex where;
  std::vector<std::int32_t> slot_token;
  Residents(const SelectionTrace& trace, int hot)
      : where(largest_token(trace, hot)), slot_token(static_cast<std::size_t>(hot)) {
    for (std::int32_t s = 0; s < hot; ++s) where.set(slot_token[s] = s, s);
  }
  void place(std::int32_t token, std::int32_t slot) {
    where.set(slot_token[slot], -1);
    slot_token[slot] = token;
    where.set(token, slot);
  }
  /// Marks the slots of the step's resident tokens in `hit` and lists the others in `misses`.
  void split(const StepDemand& d, std::vector<char>& hit, std::vector<std::int32_t>& misses) const {
    std::fill(hit.begin(), hit.end(), 0);
    misses.clear();
    for (const auto t : d.tokens) {
      if (const std::int32_t s = where.get(t); s >= 0) {
        hit[static_cast<std::size_t>(s)] = 1;
      } else {
        misses.push_back(t);
      }
    }
  }
};

/// Slot-based cache with an explicit order (LRU and FIFO differ only in how hits move).
PolicyStats simulate_ordered(ReplacementPolicy policy, const SelectionTrace& trace, int hot,
                             std::int64_t warmup_steps) {
  StepCounter count{{policy}, warmup_steps};
  DemandReader demand(trace, hot);
  Residents cache(trace, hot);
  std::vector<std::int32_t> order(static_cast<std::size_t>(hot));
  for (std::int32_t s = 0; s < hot; ++s) order[s] = s;
  std::vector<char> hit(static_cast<std::size_t>(hot));
  std::vector<std::int32_t> misses, next, taken, hits;
  for (std::size_t i = 0; i < trace.steps.size(); ++i) {
    const StepDemand& d = demand.read_servable(trace.steps[i], i);
    cache.split(d, hit, misses);
    next.clear();
    taken.clear();
    hits.clear();
    std::size_t m = 0;
    for (auto s : order) {
      if (hit[s]) {
        (policy == ReplacementPolicy::lru ? hits : next).push_back(s);
      } else if (m < misses.size()) {
        cache.place(misses[m++], s);
        taken.push_back(s);
      } else {
        next.push_back(s);
      }
    }
    next.insert(next.end(), taken.begin(), taken.end());
    next.insert(next.end(), hits.begin(), hits.end());
    order.swap(next);
    count.add(i, d, static_cast<std::int64_t>(misses.size()));
  }
  return count.stats;
}

PolicyStats simulate_random(const SelectionTrace& trace, int hot, std::uint64_t seed,
                            std::int64_t warmup_steps) {
  StepCounter count{{ReplacementPolicy::random}, warmup_steps};
  Rng rng(seed);
  DemandReader demand(trace, hot);
  Residents cache(trace, hot);
  std::vector<char> hit(static_cast<std::size_t>(hot));
  std::vector<std::int32_t> misses, evictable;
  for (std::size_t i = 0; i < trace.steps.size(); ++i) {
    const StepDemand& d = demand.read_servable(trace.steps[i], i);
    cache.split(d, hit, misses);
    evictable.clear();
    for (std::int32_t s = 0; s < hot; ++s)
      if (!hit[s]) evictable.push_back(s);
    for (auto t : misses) {
      const auto k = static_cast<std::size_t>(rng.below(evictable.size()));
      const std::int32_t s = evictable[k];
      evictable[k] = evictable.back();
      evictable.pop_back();
      cache.place(t, s);
    }
    count.add(i, d, static_cast<std::int64_t>(misses.size()));
  }
  return count.stats;
}

PolicyStats simulate_belady(const SelectionTrace& trace, int hot, std::int64_t warmup_steps) {
  StepCounter count{{ReplacementPolicy::belady}, warmup_steps};
  const std::int64_t largest = largest_token(trace, hot);
  std::vector<StepDemand> demand;
  demand.reserve(trace.steps.size());
  DemandReader reader(trace, hot);
  for (std::size_t i = 0; i < trace.steps.size(); ++i)
    demand.push_back(reader.read_servable(trace.steps[i], i));
  // The step after step i at which each of its tokens is demanded next (kNever: not again),
  // from a backward scan; after it, `next_seen` holds each token's first use.
  constexpr std::int32_t kNever = std::numeric_limits<std::int32_t>::max();
  const auto steps = static_cast<std::int32_t>(demand.size());
  std::vector<std::vector<std::int32_t>> next_use(demand.size());
  TokenIndex next_seen(largest);
  for (std::int32_t i = steps; i-- > 0;) {
    const auto& tokens = demand[static_cast<std::size_t>(i)].tokens;
    auto& after = next_use[static_cast<std::size_t>(i)];
    after.resize(tokens.size());
    for (std::size_t e = 0; e < tokens.size(); ++e) {
      const std::int32_t seen = next_seen.get(tokens[e]);
      after[e] = seen < 0 ? kNever : seen;
      next_seen.set(tokens[e], i);
    }
  }
  // Resident tokens keyed by next use; the largest key is evicted first.
  std::set<std::pair<std::int32_t, std::int32_t>> by_next;
  TokenIndex key_of(largest);
  for (std::int32_t t = 0; t < hot; ++t) {
    const std::int32_t first = next_seen.get(t);
    key_of.set(t, first < 0 ? kNever : first);
    by_next.emplace(key_of.get(t), t);
  }
  for (std::int32_t i = 0; i < steps; ++i) {
    const auto& d = demand[static_cast<std::size_t>(i)];
    std::int64_t misses = 0;
    // This step's resident tokens have key i, the smallest of all, so they are never evicted here.
    for (auto t : d.tokens) {
      if (key_of.get(t) >= 0) continue;
      ++misses;
      const auto victim = std::prev(by_next.end());
      key_of.set(victim->second, -1);
      by_next.erase(victim);
      key_of.set(t, i);
      by_next.emplace(i, t);
    }
    const auto& after = next_use[static_cast<std::size_t>(i)];
    for (std::size_t e = 0; e < d.tokens.size(); ++e) {
      const std::int32_t t = d.tokens[e];
      by_next.erase({key_of.get(t), t});
      key_of.set(t, after[e]);
      by_next.emplace(after[e], t);
    }
    count.add(static_cast<std::size_t>(i), d, misses);
  }
  return count.stats;
}
}  // namespace

StepsDemand largest_step_demand(const SelectionTrace& trace, int hot) {
  StepsDemand largest;
  DemandReader demand(trace, hot);
  for (std::size_t i = 0; i < trace.steps.size(); ++i)
    if (const auto slots = static_cast<std::int64_t>(demand.read(trace.steps[i]).tokens.size());
        slots > largest.slots)
      largest = {slots, static_cast<std::int64_t>(i)};
  return largest;
}

PolicyStats simulate_policy(ReplacementPolicy policy, const SelectionTrace& trace, int hot,
                            std::uint64_t seed, std::int64_t warmup_steps) {
  if (hot < 1)
    throw Error("policy analysis: hot", fmt::format("hot buffer of {} slots", hot),
                "use at least 1 slot");
  switch (policy) {
    case ReplacementPolicy::lru:
    case ReplacementPolicy::fifo:
      return simulate_ordered(policy, trace, hot, warmup_steps);
    case ReplacementPolicy::random:
      return simulate_random(trace, hot, seed, warmup_steps);
    case ReplacementPolicy::belady:
      return simulate_belady(trace, hot, warmup_steps);
  }
  return {};
}

std::vector<PolicyStats> analyse_policies(const SelectionTrace& trace, int hot,
                                          std::uint64_t seed) {
  std::vector<PolicyStats> out;
  for (auto p : kReplacementPolicies) out.push_back(simulate_policy(p, trace, hot, seed));
  return out;
}

SelectionTrace read_selection_trace(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in)
    throw Error(path.string(), "cannot open the selection trace",
                "check the path (text: 'seq_len: p0 p1 ...' per line)");
  SelectionTrace trace;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (const auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto colon = line.find(':');
    const std::string where = fmt::format("{}:{}", path.string(), number);
    if (colon == std::string::npos)
      throw Error(where, "missing ':' after the sequence length", "write 'seq_len: p0 p1 ...'");
    TraceStep step;
    auto parse = [&](std::string_view text, auto& value, const char* what) {
      const auto first = text.find_first_not_of(" \t\r");
      const auto last = text.find_last_not_of(" \t\r");
      text = first == std::string_view::npos ? std::string_view()
                                             : text.substr(first, last - first + 1);
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (ec != std::errc() || end != text.data() + text.size())
        throw Error(where, fmt::format("'{}' is not a valid {}", text, what),
                    "use decimal integers");
    };
    parse(std::string_view(line).substr(0, colon), step.seq_len, "sequence length");
    std::string_view rest = std::string_view(line).substr(colon + 1);
    while (true) {
      const auto start = rest.find_first_not_of(" \t\r");
      if (start == std::string_view::npos) break;
      rest = rest.substr(start);
      const auto stop = rest.find_first_of(" \t\r");
      std::int32_t pos = 0;
      parse(rest.substr(0, stop), pos, "position");
      step.selected.push_back(pos);
      if (stop == std::string_view::npos) break;
      rest = rest.substr(stop);
    }
    trace.steps.push_back(std::move(step));
  }
  return trace;
}

void write_selection_trace(const SelectionTrace& trace, const std::filesystem::path& path) {
  std::ofstream out(path);
  if (!out)
    throw Error(path.string(), "cannot write the selection trace",
                "check the directory exists and is writable");
  out << "# hisparse selection trace: seq_len: selected positions\n";
  for (const auto& step : trace.steps) {
    out << step.seq_len << ':';
    for (auto p : step.selected) out << ' ' << p;
    out << '\n';
  }
}

}  // namespace hisparse
