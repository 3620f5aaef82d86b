// Copy-engine staging probe for host-offloaded Fathom planes (a design measured and dropped;
// kernels/fathom/README.md, "Host planes staged into HBM"). The copy engines reach the PCIe ceiling
// on large runs, but which (channel, plane) runs a step needs is decided on the GPU by the depth
// plan, and the host must not wait for it. A CUDA graph can still follow a GPU-side plan: one
// switch node per (stream, channel) whose bodies copy that channel's first 1..4 planes (one
// contiguous run in the host layout), with the conditions set by a kernel from the depths. This
// measures that graph against one cudaMemcpy of the same bytes (the ceiling) and a plain graph of
// the same copies chosen on the host (the node overhead without the conditions).
// Names: fathom_plane_copy/method:<one_memcpy|plain_graph|switch_graph>/streams:S/context:N, 128
// channels, 4 planes of N/8 bytes each per channel, budget 48 (synthetic depths: channels drawn at
// random with random depths 1-4 until the budget is spent). Counters: us per call, GB/s of the
// active bytes, fraction of the measured PCIe ceiling, graph nodes.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <cstdint>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "microbench_util.hpp"
#include "plane_copy_probe.hpp"

namespace hisparse::microbench {
namespace {

enum class CopyMethod { one_memcpy, plain_graph, switch_graph };
constexpr const char* kCopyMethodNames[] = {"one_memcpy", "plain_graph", "switch_graph"};

struct PlaneCopyCase {
  CopyMethod method;
  int streams;
  std::int64_t context;
};

constexpr int kChannels = 128;
constexpr int kPlaneCount = 4;
constexpr int kBudget = 48;

#if HISPARSE_WITH_CUDA
/// Synthetic depths [stream][channel]: distinct channels with depths 1-4 until each stream's
/// planes sum to the budget.
std::vector<std::uint8_t> synthetic_depths(int streams) {
  std::vector<std::uint8_t> depths(static_cast<std::size_t>(streams) * kChannels, 0);
  Rng rng(1);
  for (int s = 0; s < streams; ++s) {
    for (int left = kBudget; left > 0;) {
      auto& d = depths[static_cast<std::size_t>(s) * kChannels + rng.below(kChannels)];
      if (d != 0) continue;
      d = static_cast<std::uint8_t>(std::min<int>(left, 1 + static_cast<int>(rng.below(4))));
      left -= d;
    }
  }
  return depths;
}

/// An explicitly built graph and its executable, destroyed together.
class BuiltGraph {
 public:
  BuiltGraph() { HISPARSE_CUDA_CHECK(cudaGraphCreate(&graph_, 0)); }
  BuiltGraph(const BuiltGraph&) = delete;
  BuiltGraph& operator=(const BuiltGraph&) = delete;
  ~BuiltGraph() {
    if (exec_) cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
  }
  [[nodiscard]] cudaGraph_t graph() const { return graph_; }
  void instantiate() { HISPARSE_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0)); }
  void launch(const Stream& stream) const {
    HISPARSE_CUDA_CHECK(cudaGraphLaunch(exec_, stream.native()));
  }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

void run_plane_copy(benchmark::State& state, const PlaneCopyCase& c) {
  const auto plane_bytes = static_cast<std::size_t>(c.context / 8);
  const std::size_t run_count = static_cast<std::size_t>(c.streams) * kChannels;
  const std::size_t total = run_count * kPlaneCount * plane_bytes;
  const Allocation& host = cached_pinned_pool(total);
  auto* src = static_cast<std::uint8_t*>(host.host_data());
  for (std::size_t i = 0; i < total; i += 4096)
    src[i] = static_cast<std::uint8_t>(i / 4096 * 7 + 3);
  auto dst = Buffer<std::uint8_t>::device(total, Backend::cuda, "staged planes");
  const std::vector<std::uint8_t> depths = synthetic_depths(c.streams);
  auto depths_d = Buffer<std::uint8_t>::device(depths.size(), Backend::cuda, "depths");
  copy_bytes(depths_d.device_data(), depths.data(), depths.size(), Backend::cuda);
  std::size_t active = 0;
  for (const auto d : depths) active += d * plane_bytes;
  const auto run_offset = [&](std::size_t i) { return i * kPlaneCount * plane_bytes; };

  Stream stream(Backend::cuda);
  GpuTimer timer(stream);
  L2Flusher l2;
  BuiltGraph graph;
  std::size_t nodes = 0;
  Buffer<cudaGraphConditionalHandle> handles_d;
  SwitchConditionArgs condition_args;
  if (c.method == CopyMethod::plain_graph) {  // the host knows the depths: active copies only
    for (std::size_t i = 0; i < run_count; ++i) {
      if (depths[i] == 0) continue;
      cudaGraphNode_t node = nullptr;
      HISPARSE_CUDA_CHECK(cudaGraphAddMemcpyNode1D(
          &node, graph.graph(), nullptr, 0, dst.device_data() + run_offset(i), src + run_offset(i),
          depths[i] * plane_bytes, cudaMemcpyHostToDevice));
      ++nodes;
    }
  } else if (c.method == CopyMethod::switch_graph) {
    std::vector<cudaGraphConditionalHandle> handles(run_count);
    for (auto& h : handles)
      HISPARSE_CUDA_CHECK(cudaGraphConditionalHandleCreate(&h, graph.graph(), kPlaneCount,
                                                           cudaGraphCondAssignDefault));
    handles_d = Buffer<cudaGraphConditionalHandle>::device(run_count, Backend::cuda, "handles");
    copy_bytes(handles_d.device_data(), handles.data(), run_count * sizeof(handles[0]),
               Backend::cuda);
    condition_args = {depths_d.device_data(), handles_d.device_data(), static_cast<int>(run_count),
                      kPlaneCount};
    void* params[] = {&condition_args};
    cudaKernelNodeParams kernel{};
    kernel.func = const_cast<void*>(switch_condition_kernel());
    kernel.gridDim = dim3(
        static_cast<unsigned>((run_count + kSwitchConditionThreads - 1) / kSwitchConditionThreads));
    kernel.blockDim = dim3(kSwitchConditionThreads);
    kernel.kernelParams = params;
    cudaGraphNode_t plan = nullptr;
    HISPARSE_CUDA_CHECK(cudaGraphAddKernelNode(&plan, graph.graph(), nullptr, 0, &kernel));
    ++nodes;
    // Every switch node depends on the condition kernel only (the fastest topology measured;
    // chains per stream or one chain were slower).
    for (std::size_t i = 0; i < run_count; ++i) {
      cudaGraphNodeParams p{};
      p.type = cudaGraphNodeTypeConditional;
      p.conditional.handle = handles[i];
      p.conditional.type = cudaGraphCondTypeSwitch;
      p.conditional.size = kPlaneCount;
      cudaGraphNode_t node = nullptr;
      HISPARSE_CUDA_CHECK(cudaGraphAddNode(&node, graph.graph(), &plan, nullptr, 1, &p));
      for (int t = 1; t <= kPlaneCount; ++t) {
        cudaGraphNode_t copy = nullptr;
        HISPARSE_CUDA_CHECK(cudaGraphAddMemcpyNode1D(
            &copy, p.conditional.phGraph_out[t - 1], nullptr, 0, dst.device_data() + run_offset(i),
            src + run_offset(i), t * plane_bytes, cudaMemcpyHostToDevice));
      }
      nodes += 1 + kPlaneCount;
    }
  }
  const auto call = [&] {
    if (c.method == CopyMethod::one_memcpy) {
      HISPARSE_CUDA_CHECK(
          cudaMemcpyAsync(dst.device_data(), src, active, cudaMemcpyHostToDevice, stream.native()));
    } else {
      graph.launch(stream);
    }
  };
  if (c.method != CopyMethod::one_memcpy) {
    graph.instantiate();
    // Exactness: the active runs arrive, nothing else is written.
    HISPARSE_CUDA_CHECK(cudaMemsetAsync(dst.device_data(), 0, total, stream.native()));
    call();
    std::vector<std::uint8_t> back(total);
    copy_bytes(back.data(), dst.device_data(), total, Backend::cuda);
    for (std::size_t i = 0; i < run_count; ++i)
      for (int t = 0; t < kPlaneCount; ++t)
        for (std::size_t k = 0; k < plane_bytes; k += 4096) {
          const std::size_t at = run_offset(i) + t * plane_bytes + k;
          if (back[at] != (t < depths[i] ? src[at] : 0))
            throw Error("fathom_plane_copy", fmt::format("run {} plane {} differs", i, t),
                        "the switch bodies copy the wrong runs");
        }
  }
  stream.synchronize();
  const double per_call = time_calls(
      state, timer, [&](std::size_t) { l2.flush(stream); }, [&](std::size_t) { call(); });
  const double gbps = static_cast<double>(active) / per_call / 1e9;
  state.counters["us_per_call"] = per_call * 1e6;
  state.counters["GBps"] = gbps;
  state.counters["pcie_fraction"] = gbps / pcie_h2d_gbps();
  state.counters["nodes"] = static_cast<double>(nodes);
  state.SetLabel(fmt::format("{:.1f} MB active, synthetic depths, PCIe ceiling {:.1f} GB/s",
                             static_cast<double>(active) / 1e6, pcie_h2d_gbps()));
}
#endif

void bench_plane_copy(benchmark::State& state, [[maybe_unused]] PlaneCopyCase c) {
  guarded(state, "fathom_plane_copy", [&] { HISPARSE_GPU_ONLY(run_plane_copy(state, c)); });
}

[[maybe_unused]] const bool registered = [] {
  for (const auto method :
       {CopyMethod::one_memcpy, CopyMethod::plain_graph, CopyMethod::switch_graph})
    for (const auto& [streams, context] :
         {std::pair{8, std::int64_t{1} << 20}, std::pair{64, std::int64_t{1} << 17}}) {
      const PlaneCopyCase c{method, streams, context};
      register_timed(fmt::format("fathom_plane_copy/method:{}/streams:{}/context:{}",
                                 kCopyMethodNames[static_cast<int>(method)], streams, context),
                     bench_plane_copy, c);
    }
  return true;
}();

}  // namespace
}  // namespace hisparse::microbench
