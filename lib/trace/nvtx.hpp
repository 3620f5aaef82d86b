// One NVTX3 domain, "hisparse", for the whole library; scoped ranges with stable colours per
// phase. Compiles to nothing with NVTX_DISABLE (and in builds without the CUDA toolkit).
//
//   HISPARSE_FUNC_RANGE();                               // range named after the function
//   HISPARSE_RANGE("swap_in", hisparse::Phase::swap_in); // named range, phase colour
//   HISPARSE_RANGE_PAYLOAD("layer", Phase::layer, layer_index);  // with an int64 payload
//   HISPARSE_PHASE_RANGE(Phase::attention);              // named after the phase (registered string)
//   HISPARSE_PHASE_RANGE_PAYLOAD(Phase::step, step);     // the same with a payload
//
// The phase travels as the NVTX category (Phase's value), so the trace collector
// (lib/trace/timeline.hpp) attributes GPU time to phases without parsing names. Every decode
// step should be wrapped in a Phase::step range whose payload is the step index: the per-phase
// breakdown groups GPU time by it.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace hisparse {

/// Phases of a decode step; each has a fixed colour in Nsight Systems and Perfetto.
// The phases, their colours and their names read as tables:
// clang-format off
enum class Phase : std::uint8_t {
  api, step, layer, embed, gemm, indexer, topk, plan, scan, select, swap_in, fetch, attention,
  ffn, append, lm_head, other
};

[[nodiscard]] constexpr std::uint32_t phase_colour(Phase p) noexcept {
  switch (p) {
    case Phase::api: return 0xff9e9e9e;
    case Phase::step: return 0xff455a64;
    case Phase::layer: return 0xff78909c;
    case Phase::embed: return 0xff8d6e63;
    case Phase::gemm: return 0xff5c6bc0;
    case Phase::indexer: return 0xffab47bc;
    case Phase::topk: return 0xff7e57c2;
    case Phase::plan: return 0xff26a69a;
    case Phase::scan: return 0xff26c6da;
    case Phase::select: return 0xff29b6f6;
    case Phase::swap_in: return 0xffef5350;
    case Phase::fetch: return 0xffff7043;
    case Phase::attention: return 0xff66bb6a;
    case Phase::ffn: return 0xffffca28;
    case Phase::append: return 0xffd4e157;
    case Phase::lm_head: return 0xffa1887f;
    case Phase::other: return 0xffbdbdbd;
  }
  return 0xffbdbdbd;
}

inline constexpr int phase_count = static_cast<int>(Phase::other) + 1;

/// The phase's name: range name of HISPARSE_PHASE_RANGE and key of the per-phase breakdown.
[[nodiscard]] constexpr const char* phase_name(Phase p) noexcept {
  switch (p) {
    case Phase::api: return "api";
    case Phase::step: return "step";
    case Phase::layer: return "layer";
    case Phase::embed: return "embed";
    case Phase::gemm: return "gemm";
    case Phase::indexer: return "indexer";
    case Phase::topk: return "topk";
    case Phase::plan: return "plan";
    case Phase::scan: return "scan";
    case Phase::select: return "select";
    case Phase::swap_in: return "swap_in";
    case Phase::fetch: return "fetch";
    case Phase::attention: return "attention";
    case Phase::ffn: return "ffn";
    case Phase::append: return "append";
    case Phase::lm_head: return "lm_head";
    case Phase::other: return "other";
  }
  return "other";
}
// clang-format on

/// Inverse of phase_name; nullopt for a name that is not a phase.
[[nodiscard]] constexpr std::optional<Phase> phase_from_name(std::string_view name) noexcept {
  for (int i = 0; i < phase_count; ++i)
    if (name == phase_name(static_cast<Phase>(i))) return static_cast<Phase>(i);
  return std::nullopt;
}

/// The phase an NVTX category stands for (the macros below set category = Phase's value).
[[nodiscard]] constexpr std::optional<Phase> phase_from_category(std::uint32_t category) noexcept {
  if (category >= static_cast<std::uint32_t>(phase_count)) return std::nullopt;
  return static_cast<Phase>(category);
}

}  // namespace hisparse

#if !defined(NVTX_DISABLE) && HISPARSE_WITH_CUDA
#include <nvtx3/nvtx3.hpp>

namespace hisparse {
/// The library's NVTX domain (filter on it in Nsight Systems: "hisparse").
struct nvtx_domain {
  static constexpr char const* name{"hisparse"};
};

namespace detail {
inline nvtx3::event_attributes range_attributes(const char* message, Phase phase) {
  return nvtx3::event_attributes{message,
                                 nvtx3::rgb{static_cast<std::uint8_t>(phase_colour(phase) >> 16),
                                            static_cast<std::uint8_t>(phase_colour(phase) >> 8),
                                            static_cast<std::uint8_t>(phase_colour(phase))},
                                 nvtx3::category{static_cast<std::uint32_t>(phase)}};
}
inline nvtx3::event_attributes range_attributes(const char* message, Phase phase,
                                                std::int64_t payload) {
  return nvtx3::event_attributes{message,
                                 nvtx3::rgb{static_cast<std::uint8_t>(phase_colour(phase) >> 16),
                                            static_cast<std::uint8_t>(phase_colour(phase) >> 8),
                                            static_cast<std::uint8_t>(phase_colour(phase))},
                                 nvtx3::category{static_cast<std::uint32_t>(phase)},
                                 nvtx3::payload{payload}};
}
/// Phase names registered once with the domain: a range then passes a handle, not a string.
inline const nvtx3::registered_string_in<nvtx_domain>& registered_phase_name(Phase phase) {
  using name = nvtx3::registered_string_in<nvtx_domain>;
  static const name names[phase_count] = {
      name{phase_name(Phase::api)},       name{phase_name(Phase::step)},
      name{phase_name(Phase::layer)},     name{phase_name(Phase::embed)},
      name{phase_name(Phase::gemm)},      name{phase_name(Phase::indexer)},
      name{phase_name(Phase::topk)},      name{phase_name(Phase::plan)},
      name{phase_name(Phase::scan)},      name{phase_name(Phase::select)},
      name{phase_name(Phase::swap_in)},   name{phase_name(Phase::fetch)},
      name{phase_name(Phase::attention)}, name{phase_name(Phase::ffn)},
      name{phase_name(Phase::append)},    name{phase_name(Phase::lm_head)},
      name{phase_name(Phase::other)}};
  return names[static_cast<int>(phase)];
}
inline nvtx3::rgb phase_rgb(Phase phase) {
  return nvtx3::rgb{static_cast<std::uint8_t>(phase_colour(phase) >> 16),
                    static_cast<std::uint8_t>(phase_colour(phase) >> 8),
                    static_cast<std::uint8_t>(phase_colour(phase))};
}
inline nvtx3::event_attributes phase_attributes(Phase phase) {
  return nvtx3::event_attributes{registered_phase_name(phase), phase_rgb(phase),
                                 nvtx3::category{static_cast<std::uint32_t>(phase)}};
}
inline nvtx3::event_attributes phase_attributes(Phase phase, std::int64_t payload) {
  return nvtx3::event_attributes{registered_phase_name(phase), phase_rgb(phase),
                                 nvtx3::category{static_cast<std::uint32_t>(phase)},
                                 nvtx3::payload{payload}};
}
}  // namespace detail
}  // namespace hisparse

#define HISPARSE_NVTX_CONCAT_(a, b) a##b
#define HISPARSE_NVTX_CONCAT(a, b) HISPARSE_NVTX_CONCAT_(a, b)
#define HISPARSE_RANGE(name, phase)                                                       \
  ::nvtx3::scoped_range_in<::hisparse::nvtx_domain> HISPARSE_NVTX_CONCAT(hisparse_range_, \
                                                                         __COUNTER__) {   \
    ::hisparse::detail::range_attributes(name, phase)                                     \
  }
#define HISPARSE_RANGE_PAYLOAD(name, phase, value)                                        \
  ::nvtx3::scoped_range_in<::hisparse::nvtx_domain> HISPARSE_NVTX_CONCAT(hisparse_range_, \
                                                                         __COUNTER__) {   \
    ::hisparse::detail::range_attributes(name, phase, static_cast<std::int64_t>(value))   \
  }
#define HISPARSE_FUNC_RANGE() HISPARSE_RANGE(__func__, ::hisparse::Phase::api)
#define HISPARSE_PHASE_RANGE(phase)                                                       \
  ::nvtx3::scoped_range_in<::hisparse::nvtx_domain> HISPARSE_NVTX_CONCAT(hisparse_range_, \
                                                                         __COUNTER__) {   \
    ::hisparse::detail::phase_attributes(phase)                                           \
  }
#define HISPARSE_PHASE_RANGE_PAYLOAD(phase, value)                                        \
  ::nvtx3::scoped_range_in<::hisparse::nvtx_domain> HISPARSE_NVTX_CONCAT(hisparse_range_, \
                                                                         __COUNTER__) {   \
    ::hisparse::detail::phase_attributes(phase, static_cast<std::int64_t>(value))         \
  }
#else
#define HISPARSE_RANGE(name, phase) (void)0
#define HISPARSE_RANGE_PAYLOAD(name, phase, value) (void)(value)
#define HISPARSE_FUNC_RANGE() (void)0
#define HISPARSE_PHASE_RANGE(phase) (void)0
#define HISPARSE_PHASE_RANGE_PAYLOAD(phase, value) (void)(value)
#endif
