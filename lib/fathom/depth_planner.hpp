// DepthPlanner: per (sequence, KV head) and step, how many planes of each channel the scan reads.
// Fathom spends a bit budget by reverse water-filling over g_j = Var(k_j) * sum_h q_hj^2 (bisection
// on theta on the GPU, the integer greedy form on the CPU twin; they agree except at exact ties).
// The comparison methods are depth plans too, so one scan, one selection and one cost convention
// serve every method: full 4-bit scan, a fixed calibrated channel set at 4 bits (Double-Sparsity-
// like), SparQ-style top-|q| channels at 4 bits, and the exact top-k oracle (no planes).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "core/stream.hpp"
#include "kernels/fathom/depth_plan.hpp"

namespace hisparse::fathom {

enum class ScanMethod { fathom, full_scan, fixed_channels, sparq, oracle };

struct MethodSpec {
  ScanMethod method = ScanMethod::fathom;
  int budget = 48;    ///< fathom: plane bits per token
  int channels = 32;  ///< fixed_channels / sparq: channels read at 4 bits
  bool klt = false;   ///< plan and scan in the keys' KLT basis (quality study; not the oracle)
  /// "fathom-48", "full-4bit", "fixed-32ch", "sparq-16", "oracle"; with klt "fathom-klt-48",
  /// "full-klt-4bit", "fixed-klt-32ch", "sparq-klt-16".
  [[nodiscard]] std::string name() const;
};

/// Bits per token of a plan in the shared cost convention: planes plus 0.25 bit of scale per
/// active channel (REFERENCE.md section 2). The oracle reads bf16 keys: 16 bits per channel.
[[nodiscard]] double plan_bits(std::span<const std::uint8_t> depths);
[[nodiscard]] int active_channels(std::span<const std::uint8_t> depths);

class DepthPlanner {
 public:
  explicit DepthPlanner(Backend backend) : backend_(backend) {}
  /// Fathom depths for every stream; pointers in the backend's memory. CUDA: the bisection kernel
  /// (no host synchronisation). CPU: the greedy integer form.
  void plan(const kernels::fathom::DepthPlanArgs& args, NativeStream stream = nullptr) const;
  [[nodiscard]] Backend backend() const noexcept { return backend_; }

 private:
  Backend backend_;
};

/// Checks a budget against head_dim; throws Error naming `where` otherwise.
void check_budget(int budget, int channels, const std::string& where);

/// Depths of one stream for a comparison method (host). `queries` [heads][channels];
/// `fixed_set` is the calibrated channel set of fixed_channels.
[[nodiscard]] std::vector<std::uint8_t> method_depths(const MethodSpec& method,
                                                      const float* queries, int heads, int channels,
                                                      std::span<const float> variance,
                                                      std::span<const int> fixed_set);

/// Offline channel choice of the fixed-channel method: the `count` channels with the largest
/// calibration Var(k_j) * mean q_j^2 over the calibration queries ([n][channels]).
[[nodiscard]] std::vector<int> calibrate_fixed_channels(std::span<const float> variance,
                                                        std::span<const float> calibration_queries,
                                                        int channels, int count);

}  // namespace hisparse::fathom
