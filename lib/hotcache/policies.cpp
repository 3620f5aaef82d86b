#include "hotcache/policies.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <limits>
#include <set>
#include <unordered_map>
#include <unordered_set>
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

StepDemand demand_of(const TraceStep& step, int hot) {
  StepDemand d;
  d.short_step = step.seq_len <= hot;
  std::unordered_set<std::int32_t> seen;
  for (auto pos : step.selected) {
    if (pos < 0 || pos >= step.seq_len) continue;
    ++d.valid;
    if (d.short_step || pos == step.seq_len - 1) continue;
    if (seen.insert(pos).second) d.tokens.push_back(pos);
  }
  return d;
}

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

/// Slot-based cache with an explicit order (LRU and FIFO differ only in how hits move).
PolicyStats simulate_ordered(ReplacementPolicy policy, const SelectionTrace& trace, int hot,
                             std::int64_t warmup_steps) {
  StepCounter count{{policy}, warmup_steps};
  std::vector<std::int32_t> slot_token(static_cast<std::size_t>(hot)),
      order(static_cast<std::size_t>(hot));
  std::unordered_map<std::int32_t, std::int32_t> where;
  for (std::int32_t s = 0; s < hot; ++s) {
    slot_token[s] = s;
    order[s] = s;
    where[s] = s;
  }
  std::vector<char> hit(static_cast<std::size_t>(hot));
  for (std::size_t i = 0; i < trace.steps.size(); ++i) {
    const StepDemand d = demand_of(trace.steps[i], hot);
    std::vector<std::int32_t> misses;
    std::fill(hit.begin(), hit.end(), 0);
    for (auto t : d.tokens) {
      if (auto it = where.find(t); it != where.end()) {
        hit[it->second] = 1;
      } else {
        misses.push_back(t);
      }
    }
    std::vector<std::int32_t> next, taken, hits;
    std::size_t m = 0;
    for (auto s : order) {
      if (hit[s]) {
        (policy == ReplacementPolicy::lru ? hits : next).push_back(s);
      } else if (m < misses.size()) {
        where.erase(slot_token[s]);
        slot_token[s] = misses[m++];
        where[slot_token[s]] = s;
        taken.push_back(s);
      } else {
        next.push_back(s);
      }
    }
    next.insert(next.end(), taken.begin(), taken.end());
    next.insert(next.end(), hits.begin(), hits.end());
    order = std::move(next);
    count.add(i, d, static_cast<std::int64_t>(misses.size()));
  }
  return count.stats;
}

PolicyStats simulate_random(const SelectionTrace& trace, int hot, std::uint64_t seed,
                            std::int64_t warmup_steps) {
  StepCounter count{{ReplacementPolicy::random}, warmup_steps};
  Rng rng(seed);
  std::vector<std::int32_t> slot_token(static_cast<std::size_t>(hot));
  std::unordered_map<std::int32_t, std::int32_t> where;
  for (std::int32_t s = 0; s < hot; ++s) where[slot_token[s] = s] = s;
  std::vector<char> hit(static_cast<std::size_t>(hot));
  for (std::size_t i = 0; i < trace.steps.size(); ++i) {
    const StepDemand d = demand_of(trace.steps[i], hot);
    std::fill(hit.begin(), hit.end(), 0);
    std::vector<std::int32_t> misses;
    for (auto t : d.tokens) {
      if (auto it = where.find(t); it != where.end()) {
        hit[it->second] = 1;
      } else {
        misses.push_back(t);
      }
    }
    std::vector<std::int32_t> evictable;
    for (std::int32_t s = 0; s < hot; ++s)
      if (!hit[s]) evictable.push_back(s);
    for (auto t : misses) {
      const auto k = static_cast<std::size_t>(rng.below(evictable.size()));
      const std::int32_t s = evictable[k];
      evictable[k] = evictable.back();
      evictable.pop_back();
      where.erase(slot_token[s]);
      where[slot_token[s] = t] = s;
    }
    count.add(i, d, static_cast<std::int64_t>(misses.size()));
  }
  return count.stats;
}

PolicyStats simulate_belady(const SelectionTrace& trace, int hot, std::int64_t warmup_steps) {
  StepCounter count{{ReplacementPolicy::belady}, warmup_steps};
  std::vector<StepDemand> demand;
  demand.reserve(trace.steps.size());
  for (const auto& step : trace.steps) demand.push_back(demand_of(step, hot));
  // Steps (in order) at which each token is demanded.
  std::unordered_map<std::int32_t, std::vector<int>> uses;
  for (int i = 0; i < static_cast<int>(demand.size()); ++i)
    for (auto t : demand[i].tokens) uses[t].push_back(i);
  constexpr int kNever = std::numeric_limits<int>::max();
  auto next_use = [&](std::int32_t token, int after) {
    const auto it = uses.find(token);
    if (it == uses.end()) return kNever;
    const auto pos = std::upper_bound(it->second.begin(), it->second.end(), after);
    return pos == it->second.end() ? kNever : *pos;
  };
  // Resident tokens keyed by next use; the largest key is evicted first.
  std::set<std::pair<int, std::int32_t>> by_next;
  std::unordered_map<std::int32_t, int> key_of;
  for (std::int32_t t = 0; t < hot; ++t) {
    key_of[t] = next_use(t, -1);
    by_next.emplace(key_of[t], t);
  }
  for (int i = 0; i < static_cast<int>(demand.size()); ++i) {
    const auto& d = demand[i];
    std::int64_t misses = 0;
    // This step's resident tokens have key i, the smallest of all, so they are never evicted here.
    for (auto t : d.tokens) {
      if (key_of.contains(t)) continue;
      ++misses;
      const auto victim = std::prev(by_next.end());
      key_of.erase(victim->second);
      by_next.erase(victim);
      key_of[t] = i;
      by_next.emplace(i, t);
    }
    for (auto t : d.tokens) {
      by_next.erase({key_of[t], t});
      key_of[t] = next_use(t, i);
      by_next.emplace(key_of[t], t);
    }
    count.add(static_cast<std::size_t>(i), d, misses);
  }
  return count.stats;
}
}  // namespace

std::int64_t slots_needed(const TraceStep& step, int hot) {
  return static_cast<std::int64_t>(demand_of(step, hot).tokens.size());
}

PolicyStats simulate_policy(ReplacementPolicy policy, const SelectionTrace& trace, int hot,
                            std::uint64_t seed, std::int64_t warmup_steps) {
  if (hot < 1)
    throw Error("policy analysis: hot", fmt::format("hot buffer of {} slots", hot),
                "use at least 1 slot");
  for (std::size_t i = 0; i < trace.steps.size(); ++i) {
    if (slots_needed(trace.steps[i], hot) > hot)
      throw Error(
          fmt::format("policy analysis: trace step {}", i),
          fmt::format("more distinct selected positions than the {} slots of the hot buffer", hot),
          "use hot >= top_k");
  }
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
      text = text.substr(first, last - first + 1);
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
