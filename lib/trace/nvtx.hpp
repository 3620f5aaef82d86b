// One NVTX3 domain, "hisparse", for the whole library; scoped ranges with stable colours per
// phase. Compiles to nothing with NVTX_DISABLE (and in builds without the CUDA toolkit).
//
//   HISPARSE_FUNC_RANGE();                               // range named after the function
//   HISPARSE_RANGE("swap_in", hisparse::Phase::swap_in); // named range, phase colour
//   HISPARSE_RANGE_PAYLOAD("layer", Phase::layer, layer_index);  // with an int64 payload
#pragma once

#include <cstdint>

namespace hisparse {

/// Phases of a decode step; each has a fixed colour in Nsight Systems and Perfetto.
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
  return nvtx3::event_attributes{message, nvtx3::rgb{static_cast<std::uint8_t>(phase_colour(phase) >> 16),
                                                     static_cast<std::uint8_t>(phase_colour(phase) >> 8),
                                                     static_cast<std::uint8_t>(phase_colour(phase))},
                                 nvtx3::category{static_cast<std::uint32_t>(phase)}};
}
inline nvtx3::event_attributes range_attributes(const char* message, Phase phase, std::int64_t payload) {
  return nvtx3::event_attributes{message,
                                 nvtx3::rgb{static_cast<std::uint8_t>(phase_colour(phase) >> 16),
                                            static_cast<std::uint8_t>(phase_colour(phase) >> 8),
                                            static_cast<std::uint8_t>(phase_colour(phase))},
                                 nvtx3::category{static_cast<std::uint32_t>(phase)},
                                 nvtx3::payload{payload}};
}
}  // namespace detail
}  // namespace hisparse

#define HISPARSE_NVTX_CONCAT_(a, b) a##b
#define HISPARSE_NVTX_CONCAT(a, b) HISPARSE_NVTX_CONCAT_(a, b)
#define HISPARSE_RANGE(name, phase)                                                 \
  ::nvtx3::scoped_range_in<::hisparse::nvtx_domain> HISPARSE_NVTX_CONCAT(           \
      hisparse_range_, __COUNTER__) {                                                  \
    ::hisparse::detail::range_attributes(name, phase)                               \
  }
#define HISPARSE_RANGE_PAYLOAD(name, phase, value)                                  \
  ::nvtx3::scoped_range_in<::hisparse::nvtx_domain> HISPARSE_NVTX_CONCAT(           \
      hisparse_range_, __COUNTER__) {                                                  \
    ::hisparse::detail::range_attributes(name, phase, static_cast<std::int64_t>(value)) \
  }
#define HISPARSE_FUNC_RANGE() HISPARSE_RANGE(__func__, ::hisparse::Phase::api)
#else
#define HISPARSE_RANGE(name, phase) (void)0
#define HISPARSE_RANGE_PAYLOAD(name, phase, value) (void)(value)
#define HISPARSE_FUNC_RANGE() (void)0
#endif
