#include "bench/pipeline_verifier.hpp"

#include <algorithm>
#include <optional>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.hpp"
#include "core/metrics.hpp"
#include "model/capacity_model.hpp"
#include "trace/nvtx.hpp"

namespace hisparse {

namespace {
// The engines' agreement on the tiny models (tests/gpu/decode_engine_gpu_test.cpp): fp32 GEMMs
// differ by float rounding only; bf16 GEMMs turn such differences into bf16 steps (2^-8).
constexpr double kFp32QueryTolerance = 1e-4, kFp32AttentionTolerance = 1e-3;
constexpr double kBf16Tolerance = 3e-2;
// The same rows read from the hot buffer instead of the GPU-resident cache, by the same kernels.
constexpr double kSameKernelsTolerance = 1e-6;

// The twin of a CUDA point: the mode without offload on the GPU (large models), or none.
std::optional<Mode> gpu_twin_mode(Mode mode) {
  if (mode == Mode::hisparse) return Mode::sparse_gpu;
  if (mode == Mode::hisparse_fathom) return Mode::fathom;
  return std::nullopt;
}

constexpr const char* kFix =
    "the engine and its twin disagree: run the GPU tests (ctest --preset gpu, or "
    ".ci/device-check gpu-tests) to find the kernel, and report the scenario";
}  // namespace

void to_json(nlohmann::json& j, const VerifyReport& r) {
  j = nlohmann::json{
      {"twin", r.twin},
      {"every", r.every},
      {"steps", r.steps},
      {"layer_steps", r.layer_steps},
      {"query_tolerance", r.query_tolerance},
      {"attention_tolerance", r.attention_tolerance},
      {"max_query_error", r.max_query_error},
      {"max_attention_error", r.max_attention_error},
      {"finite_checked", true},
      {"diverged_at_step",
       r.diverged_at_step < 0 ? nlohmann::json(nullptr) : nlohmann::json(r.diverged_at_step)}};
}

EngineConfig PipelineVerifier::checked(EngineConfig config) {
  config.check_finite = true;
  return config;
}

PipelineVerifier::PipelineVerifier(const ModelSpec& model, const EngineConfig& config, int every)
    : model_(model), config_(checked(config)) {
  report_.every = std::max(every, 1);
  if (config_.backend == Backend::cpu) {
    report_.twin = "none: the CPU engine is the reference (non-finite check only)";
    return;
  }
  HISPARSE_RANGE("verify_twin", Phase::other);
  EngineConfig twin = config_;
  const bool large = static_cast<double>(CapacityModel(model).weight_bytes()) > kCpuTwinWeightBytes;
  if (!large) {
    twin.backend = Backend::cpu;
    compare_hot_buffer_ = true;
    report_.twin = "cpu engine";
  } else if (const auto mode = gpu_twin_mode(config_.mode)) {
    twin.mode = *mode;
    report_.twin = fmt::format("cuda engine, mode {}", name_of(*mode));
  } else {
    report_.twin = fmt::format(
        "none: a CPU step of {} takes minutes, and {} has no mode without offload to compare "
        "with (non-finite check only)",
        model.name, name_of(config_.mode));
    return;
  }
  try {
    twin_ = std::make_unique<DecodeEngine>(model, twin);
  } catch (const Error& e) {
    throw Error("--verify",
                fmt::format("the twin of the point ({}) did not start: {}: {}", report_.twin,
                            e.where(), e.problem()),
                "verify a smaller point (lower concurrency or context_length), or run without "
                "--verify");
  }
  if (!compare_hot_buffer_) {
    report_.query_tolerance = report_.attention_tolerance = kSameKernelsTolerance;
  } else {
    report_.query_tolerance = config_.bf16_gemm ? kBf16Tolerance : kFp32QueryTolerance;
    report_.attention_tolerance = config_.bf16_gemm ? kBf16Tolerance : kFp32AttentionTolerance;
  }
}

PipelineVerifier::~PipelineVerifier() = default;

std::string PipelineVerifier::where(int step) const {
  return fmt::format("--verify: {} {} at context {}, step {}", model_.name, name_of(config_.mode),
                     config_.context_length, step);
}

void PipelineVerifier::after_step(int step, const DecodeEngine& engine, const StepStats& got) {
  if (!twin_) return;
  HISPARSE_RANGE("verify", Phase::other);
  const StepStats want = twin_->step();
  ++report_.steps;
  std::string differs;
  if (got.next_tokens != want.next_tokens)
    differs = fmt::format("the next tokens differ: {} against the twin's ({}) {}", got.next_tokens,
                          report_.twin, want.next_tokens);
  else if (compare_hot_buffer_ && (got.hits != want.hits || got.misses != want.misses))
    differs =
        fmt::format("the hot buffer differs: {} hits / {} misses against the CPU twin's {} / {}",
                    got.hits, got.misses, want.hits, want.misses);
  if (!differs.empty()) {
    // A GPU twin runs the same kernels on the same values: any difference is a fault.
    if (!config_.bf16_gemm || !compare_hot_buffer_) throw Error(where(step), differs, kFix);
    // A bf16 rounding flip moved an argmax or a selection's edge: from here on the two decode
    // differently, so there is nothing left to compare.
    report_.diverged_at_step = step;
    twin_.reset();
    return;
  }
  if (step % report_.every != 0) return;
  ++report_.layer_steps;
  for (int l = 0; l < model_.layers; ++l) {
    const auto compare = [&](const std::vector<float>& a, const std::vector<float>& b,
                             const char* what, double tolerance, double& worst) {
      if (a.size() != b.size())
        throw Error(where(step),
                    fmt::format("layer {}'s {} hold {} floats here and {} in the twin ({})", l,
                                what, a.size(), b.size(), report_.twin),
                    kFix);
      const double e = relative_l2(a, b);
      worst = std::max(worst, e);
      if (!(e <= tolerance))  // NaN fails too
        throw Error(where(step),
                    fmt::format("layer {}'s {} differ from the twin's ({}) by {:.3g} "
                                "(relative L2), above the tolerance {:g}",
                                l, what, report_.twin, e, tolerance),
                    kFix);
    };
    compare(engine.last_queries(l), twin_->last_queries(l), "attention queries",
            report_.query_tolerance, report_.max_query_error);
    compare(engine.last_attention(l), twin_->last_attention(l), "attention outputs",
            report_.attention_tolerance, report_.max_attention_error);
  }
}

}  // namespace hisparse
