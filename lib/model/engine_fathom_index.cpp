#include "model/engine_fathom_index.hpp"

#include <algorithm>
#include <span>

#include <fmt/format.h>

#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "fathom/depth_planner.hpp"
#include "fathom/synthetic_keys.hpp"
#include "kernels/fathom/fathom_math.hpp"

namespace hisparse {
namespace {
constexpr int kCalibrationSkip = 16;  // attention sinks distort the first tokens' statistics

}  // namespace

FathomKeyIndex::FathomKeyIndex(const FathomIndexShape& shape,
                               const fathom::SelectorConfig& selector, Backend backend)
    : shape_(shape),
      width_(selector.max_rows(shape.group)),
      selector_(backend, selector),
      backend_(backend) {
  fathom::check_budget(selector.budget, shape.head_dim, "budget_bits");
  for (int l = 0; l < shape.layers; ++l) {
    stores_.push_back(std::make_unique<fathom::PlaneStore>(
        backend, fathom::PlaneLayoutKind::host, shape.streams, shape.head_dim, shape.capacity,
        fmt::format("fathom planes of layer {}", l)));
    variances_.emplace_back(static_cast<std::size_t>(shape.streams) *
                            static_cast<std::size_t>(shape.head_dim));
    bases_.emplace_back(shape.klt ? static_cast<std::size_t>(shape.streams) : 0,
                        fathom::KltBasis::identity(shape.head_dim));
    centres_.emplace_back(shape.centre_keys ? static_cast<std::size_t>(shape.streams) : 0,
                          fathom::KeyCentre::none(shape.head_dim));
    reads_.emplace_back();
    budgets_.emplace_back();
    if (shape.head_budgets.empty()) continue;
    const auto heads =
        fathom::head_budgets(shape.head_budgets, shape.kv_heads, l, selector.budget,
                             kernels::fathom::kPlanes * shape.head_dim, "fathom.head_budgets");
    for (int s = 0; s < shape.streams; ++s)
      budgets_.back().push_back(heads[static_cast<std::size_t>(s % shape.kv_heads)]);
  }
}

void FathomKeyIndex::load_context(int layer, const float* keys, std::int64_t stream_stride,
                                  std::int64_t tokens) {
  const auto d = static_cast<std::size_t>(shape_.head_dim);
  const auto per_stream = static_cast<std::size_t>(tokens) * d;
  const bool measured = selector_.config().rule == fathom::PlanRule::measured;
  std::vector<std::uint16_t> bf(static_cast<std::size_t>(shape_.streams) * per_stream);
  std::vector<fathom::PlaneReadCalibration> reads;
  for (int s = 0; s < shape_.streams; ++s) {
    const float* src = keys + static_cast<std::ptrdiff_t>(s) * stream_stride;
    std::uint16_t* dst = bf.data() + static_cast<std::size_t>(s) * per_stream;
    for (std::size_t i = 0; i < per_stream; ++i) dst[i] = float_to_bf16(src[i]);
    if (shape_.centre_keys) {  // the mean of the same calibration tokens, off every stored key
      fathom::KeyCentre& centre =
          centres_[static_cast<std::size_t>(layer)][static_cast<std::size_t>(s)];
      centre =
          fathom::KeyCentre::calibrate(dst, tokens, shape_.head_dim, kCalibrationSkip,
                                       static_cast<int>(std::min<std::int64_t>(tokens, INT32_MAX)));
      centre.apply(dst, dst, tokens);
    }
    std::vector<float> var;
    if (shape_.klt) {
      // The stream's eigenbasis from the same calibration tokens; the store holds rotated keys.
      fathom::KltBasis& basis =
          bases_[static_cast<std::size_t>(layer)][static_cast<std::size_t>(s)];
      basis = fathom::KltBasis::calibrate(dst, tokens, shape_.head_dim, kCalibrationSkip, tokens);
      const std::vector<std::uint16_t> original(dst, dst + per_stream);
      basis.rotate_keys(original.data(), dst, tokens);
      var = basis.variances();
    } else {
      var =
          fathom::calibration_variance(dst, tokens, shape_.head_dim, kCalibrationSkip,
                                       static_cast<int>(std::min<std::int64_t>(tokens, INT32_MAX)));
    }
    if (measured)
      reads.push_back(fathom::calibrate_plane_reads(
          dst, tokens, shape_.head_dim, kCalibrationSkip,
          static_cast<int>(std::min<std::int64_t>(tokens, INT32_MAX))));
    std::copy(var.begin(), var.end(),
              variances_[static_cast<std::size_t>(layer)].begin() +
                  static_cast<std::ptrdiff_t>(static_cast<std::size_t>(s) * d));
  }
  stores_[static_cast<std::size_t>(layer)]->append(0, shape_.streams,
                                                   readable(bf.data(), bf.size()), shape_.head_dim,
                                                   static_cast<std::int64_t>(per_stream), tokens);
  // Packed once here: the decode steps plan from these tables without packing or copying them.
  if (measured)
    reads_[static_cast<std::size_t>(layer)].emplace(
        stores_[static_cast<std::size_t>(layer)]->backend(), reads, shape_.head_dim);
}

void FathomKeyIndex::append(int layer, const float* keys) {
  // Per-step scratch kept between calls: no allocation on the decode path.
  const auto n =
      static_cast<std::size_t>(shape_.streams) * static_cast<std::size_t>(shape_.head_dim);
  key_bf16_.resize(n);
  for (std::size_t i = 0; i < n; ++i) key_bf16_[i] = float_to_bf16(keys[i]);
  if (shape_.centre_keys)
    for (int s = 0; s < shape_.streams; ++s) {
      const auto at = static_cast<std::size_t>(s) * static_cast<std::size_t>(shape_.head_dim);
      centres_[static_cast<std::size_t>(layer)][static_cast<std::size_t>(s)].apply(
          key_bf16_.data() + at, key_bf16_.data() + at, 1);
    }
  if (shape_.klt) {  // the stored keys are rotated; rotate_keys needs a separate output
    key_rotated_.resize(n);
    for (int s = 0; s < shape_.streams; ++s) {
      const auto at = static_cast<std::size_t>(s) * static_cast<std::size_t>(shape_.head_dim);
      bases_[static_cast<std::size_t>(layer)][static_cast<std::size_t>(s)].rotate_keys(
          key_bf16_.data() + at, key_rotated_.data() + at, 1);
    }
  }
  stores_[static_cast<std::size_t>(layer)]->append(
      0, shape_.streams, readable(shape_.klt ? key_rotated_.data() : key_bf16_.data(), n),
      shape_.head_dim, shape_.head_dim, 1);
}

// The plane store's kernels read device memory on CUDA: the host keys are copied there first
// (synchronously, into one staging buffer kept between calls).
const std::uint16_t* FathomKeyIndex::readable(const std::uint16_t* host, std::size_t n) {
  if (backend_ == Backend::cpu) return host;
  std::uint16_t* dev = staging_.reserve_device(n, backend_, "fathom key staging");
  copy_bytes(dev, host, n * sizeof(std::uint16_t), backend_);
  return dev;
}

FathomSelectStats FathomKeyIndex::select(int layer, const float* queries, std::int32_t* out) {
  const fathom::PlaneStore& store = *stores_[static_cast<std::size_t>(layer)];
  if (shape_.klt) {  // queries into each stream's basis (q'.k' = q.k)
    const auto per_stream = static_cast<std::size_t>(shape_.group) * shape_.head_dim;
    rotated_queries_.resize(static_cast<std::size_t>(shape_.streams) * per_stream);
    for (int s = 0; s < shape_.streams; ++s)
      bases_[static_cast<std::size_t>(layer)][static_cast<std::size_t>(s)].rotate(
          queries + static_cast<std::size_t>(s) * per_stream,
          rotated_queries_.data() + static_cast<std::size_t>(s) * per_stream, shape_.group);
    queries = rotated_queries_.data();
  }
  const auto& tables = reads_[static_cast<std::size_t>(layer)];
  const auto selection = selector_.select(
      store, queries, shape_.group, variances_[static_cast<std::size_t>(layer)].data(),
      shape_.streams, tables ? &*tables : nullptr, budgets_[static_cast<std::size_t>(layer)]);
  const auto& depths = selector_.last_depths();
  const auto d = static_cast<std::size_t>(shape_.head_dim);
  FathomSelectStats stats;
  for (int s = 0; s < shape_.streams; ++s) {
    const auto& sel = selection[static_cast<std::size_t>(s)];
    std::int32_t* row = out + static_cast<std::ptrdiff_t>(s) * width_;
    const auto n = std::min<std::size_t>(sel.size(), static_cast<std::size_t>(width_));
    std::copy_n(sel.begin(), n, row);
    std::fill(row + n, row + width_, -1);
    stats.rows_selected += static_cast<std::int64_t>(n);
    // The scan reads whole 64-token words of every active (channel, plane) and one fp16 scale
    // per block of every active channel that reads its scales (sign reads do not): per block
    // 8 B per plane and 2 B per scale, which is 8 B per plan bit (a plane is 1 bit per token, a
    // scale 0.25; the sum is exact in double).
    const std::span<const std::uint8_t> plan(depths.data() + static_cast<std::size_t>(s) * d, d);
    const std::int64_t blocks =
        (store.length(s) + kernels::fathom::kBlockTokens - 1) / kernels::fathom::kBlockTokens;
    const double bits = fathom::plan_bits(plan);
    stats.bytes_scanned += blocks * static_cast<std::int64_t>(8.0 * bits);
    stats.plans += 1;
    stats.plan_bits += bits;
    stats.active_channels += fathom::active_channels(plan);
  }
  return stats;
}

}  // namespace hisparse
