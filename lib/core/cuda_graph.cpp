#include "core/cuda_graph.hpp"

#if HISPARSE_WITH_CUDA
#include <fmt/format.h>

#include "core/cuda_check.hpp"
#include "core/error.hpp"

namespace hisparse {

CudaGraph::CudaGraph(const Stream& stream, const std::function<void()>& enqueue, const char* what) {
  HISPARSE_CUDA_CHECK(cudaStreamBeginCapture(stream.native(), cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  try {
    enqueue();
  } catch (...) {
    (void)cudaStreamEndCapture(stream.native(), &graph);  // leave capture mode, then report
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw;
  }
  const cudaError_t ended = cudaStreamEndCapture(stream.native(), &graph);
  if (ended != cudaSuccess || graph == nullptr) {
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw Error(what, fmt::format("capturing a CUDA graph failed: {}", cudaGetErrorString(ended)),
                "run it without the graph (deployment.cuda_graph: false) and report this");
  }
  HISPARSE_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes_));
  const cudaError_t made = cudaGraphInstantiate(&exec_, graph, 0);
  cudaGraphDestroy(graph);
  if (made != cudaSuccess)
    throw Error(what,
                fmt::format("instantiating its CUDA graph failed: {}", cudaGetErrorString(made)),
                "run it without the graph (deployment.cuda_graph: false) and report this");
}

CudaGraph::~CudaGraph() {
  if (exec_) cudaGraphExecDestroy(exec_);
}

void CudaGraph::launch(const Stream& stream) const {
  HISPARSE_CUDA_CHECK(cudaGraphLaunch(exec_, stream.native()));
}

}  // namespace hisparse
#endif
