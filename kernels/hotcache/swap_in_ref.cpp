// CPU twin of the swap-in: the contract of swap_in.hpp written plainly. It is the oracle the CUDA
// kernels are compared against byte for byte, so every choice here (miss order, LRU order) is
// the contract, not an implementation detail.
#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "kernels/hotcache/swap_in.hpp"
#include "kernels/hotcache/swap_in_config.hpp"

namespace hisparse::kernels {

int swap_in_hash_capacity(int top_k) noexcept {
  int capacity = 32;
  while (capacity < 2 * top_k) capacity *= 2;
  return capacity;
}

std::size_t swap_in_shared_bytes(int top_k, int hot) noexcept {
  const auto h = static_cast<std::size_t>(swap_in_hash_capacity(top_k));
  const auto words = static_cast<std::size_t>((hot + 31) / 32);
  // Hash keys and values, hit bits, scan scratch, miss-bucket counts, new LRU order (uint16),
  // evicted slot of each miss (uint16). The layout is in swap_in.cu.
  const std::size_t bytes = 8 * h + 4 * words + 4 * kSwapInScratchInts + 4 * kSwapInBuckets +
                            2 * static_cast<std::size_t>(hot) + 2 * static_cast<std::size_t>(top_k);
  return (bytes + 15) / 16 * 16;
}

std::size_t swap_in_direct_shared_bytes(int top_k, int hot) noexcept {
  const auto hash_area = 8 * static_cast<std::size_t>(swap_in_hash_capacity(top_k));
  const auto direct_area = 4 * static_cast<std::size_t>(swap_in_config::kResolveDirectTokens);
  // Plus the plan entry of each miss (uint16) when the early hand-off lists tokens first.
  const auto entries = (2 * static_cast<std::size_t>(top_k) + 15) / 16 * 16;
  return swap_in_shared_bytes(top_k, hot) - hash_area + std::max(hash_area, direct_area) + entries;
}

const char* swap_in_phase_name(int k) noexcept {
  static const char* const kNames[kSwapInPhaseStamps] = {
      "entry", "inputs", "init", "build", "hits", "misses", "lru", "buckets", "commit"};
  return k >= 0 && k < kSwapInPhaseStamps ? kNames[k] : "?";
}

const char* resolve_path_name(ResolvePath path) noexcept {
  switch (path) {
    case ResolvePath::direct:
      return "direct";
    case ResolvePath::direct_compact:
      return "direct_compact";
    case ResolvePath::direct_general:
      return "direct_general";
    case ResolvePath::hash:
      return "hash";
  }
  return "?";
}

std::optional<ResolvePath> resolve_path_named(std::string_view name) noexcept {
  for (const ResolvePath path : kResolvePaths)
    if (name == resolve_path_name(path)) return path;
  return std::nullopt;
}

namespace {
std::int64_t seq_len_of(const SwapInArgs& a, int row) {
  return a.seq_lens_int64 ? static_cast<const std::int64_t*>(a.seq_lens)[row]
                          : static_cast<const std::int32_t*>(a.seq_lens)[row];
}

void write_stats(const SwapInArgs& a, int row, std::int32_t hits, std::int32_t misses) {
  if (a.stats) {
    a.stats[2 * row] = hits;
    a.stats[2 * row + 1] = misses;
  }
  a.plan.count[row] = misses;
  if (a.plan.entry_slot)  // the misses' first occurrences are set after this
    std::fill_n(a.plan.entry_slot + static_cast<std::size_t>(row) * a.top_k, a.top_k, -1);
}

// Residency bitmap of request r (HotBufferView::resident): bit t on or off.
void mark_resident(const SwapInArgs& a, int r, std::int32_t token, bool on) {
  const HotBufferView& h = a.hot_buffer;
  if (!h.resident || token < 0 || static_cast<std::size_t>(token) >= 32 * h.resident_words) return;
  std::uint32_t& word = h.resident[static_cast<std::size_t>(r) * h.resident_words + token / 32];
  const std::uint32_t bit = 1u << (token % 32);
  word = on ? word | bit : word & ~bit;
}
}  // namespace

void swap_in_ref(const SwapInArgs& a) {
  const int num_real = *a.num_real;
  const int hot = a.hot;
  for (int b = 0; b < a.batch; ++b) {
    const std::int32_t* sel = a.selected + static_cast<std::size_t>(b) * a.top_k;
    std::int32_t* out = a.physical_rows + static_cast<std::size_t>(b) * a.top_k;
    if (b >= num_real) {  // padding row: -1 everywhere, nothing else touched
      for (int i = 0; i < a.top_k; ++i) out[i] = -1;
      write_stats(a, b, 0, 0);
      continue;
    }
    const int r = a.request_of_row ? a.request_of_row[b] : b;
    const std::int64_t seq_len = seq_len_of(a, b);
    const std::int32_t base = r * (hot + 1);
    auto valid = [&](std::int32_t pos) { return pos >= 0 && pos < seq_len; };
    std::int32_t valid_entries = 0;
    for (int i = 0; i < a.top_k; ++i) valid_entries += valid(sel[i]) ? 1 : 0;

    if (seq_len <= hot) {  // short sequence: token t in slot t
      for (int i = 0; i < a.top_k; ++i) out[i] = valid(sel[i]) ? base + sel[i] : -1;
      write_stats(a, b, valid_entries, 0);
      continue;
    }

    std::int32_t* slot_token = a.hot_buffer.slot_token + static_cast<std::size_t>(r) * hot;
    std::int32_t* lru = a.hot_buffer.lru + static_cast<std::size_t>(r) * hot;
    const auto newest = static_cast<std::int32_t>(seq_len - 1);

    std::unordered_map<std::int32_t, std::int32_t> resident;  // token -> slot
    for (int s = 0; s < hot; ++s)
      if (slot_token[s] >= 0) resident.emplace(slot_token[s], s);

    // Hits mark their slot; misses are numbered in order of first occurrence.
    std::vector<char> is_hit(static_cast<std::size_t>(hot), 0);
    std::unordered_map<std::int32_t, std::int32_t> slot_of;  // selected position -> slot or ~miss
    std::vector<std::int32_t> miss_tokens;
    for (int i = 0; i < a.top_k; ++i) {
      const std::int32_t pos = sel[i];
      if (!valid(pos) || pos == newest || slot_of.contains(pos)) continue;
      if (auto it = resident.find(pos); it != resident.end()) {
        slot_of[pos] = it->second;
        is_hit[static_cast<std::size_t>(it->second)] = 1;
      } else {
        slot_of[pos] = ~static_cast<std::int32_t>(miss_tokens.size());
        miss_tokens.push_back(pos);
      }
    }
    const auto n_miss = static_cast<std::int32_t>(miss_tokens.size());

    // Walk the LRU order: the m-th evictable slot goes to the m-th miss.
    std::vector<std::int32_t> untouched, missed, hits;
    for (int p = 0; p < hot; ++p) {
      const std::int32_t s = lru[p];
      if (is_hit[static_cast<std::size_t>(s)]) {
        hits.push_back(s);
      } else if (static_cast<std::int32_t>(missed.size()) < n_miss) {
        missed.push_back(s);
      } else {
        untouched.push_back(s);
      }
    }
    std::size_t p = 0;
    for (auto s : untouched) lru[p++] = s;
    for (auto s : missed) lru[p++] = s;
    for (auto s : hits) lru[p++] = s;

    for (std::int32_t m = 0; m < n_miss; ++m) {
      const std::int32_t slot = missed[static_cast<std::size_t>(m)];
      const std::int32_t token = miss_tokens[static_cast<std::size_t>(m)];
      mark_resident(a, r, slot_token[slot], false);
      mark_resident(a, r, token, true);
      slot_token[slot] = token;
      a.plan.slot[static_cast<std::size_t>(b) * a.top_k + m] = slot;
      a.plan.token[static_cast<std::size_t>(b) * a.top_k + m] = token;
      std::memcpy(
          a.hot_buffer.rows + static_cast<std::size_t>(base + slot) * a.hot_buffer.row_stride,
          a.host_pool.base + static_cast<std::size_t>(r) * a.host_pool.request_stride +
              static_cast<std::size_t>(token) * a.host_pool.row_stride,
          a.copy_bytes);
    }

    for (int i = 0; i < a.top_k; ++i) {
      const std::int32_t pos = sel[i];
      if (!valid(pos)) {
        out[i] = -1;
      } else if (pos == newest) {
        out[i] = base + hot;
      } else {
        const std::int32_t v = slot_of.at(pos);
        out[i] = base + (v >= 0 ? v : missed[static_cast<std::size_t>(~v)]);
      }
    }
    write_stats(a, b, valid_entries - n_miss, n_miss);
    if (a.plan.entry_slot) {  // first occurrences of the misses, in selection order
      std::int32_t m = 0;
      for (int i = 0; i < a.top_k && m < n_miss; ++i)
        if (sel[i] == miss_tokens[static_cast<std::size_t>(m)])
          a.plan.entry_slot[static_cast<std::size_t>(b) * a.top_k + i] =
              missed[static_cast<std::size_t>(m++)];
    }
  }
}

}  // namespace hisparse::kernels
