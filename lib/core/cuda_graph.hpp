// A CUDA graph captured from a stream and replayed with one launch (CUDA builds only). Work on
// other streams joins the capture through events recorded on the capturing stream, as eagerly
// enqueued work would wait for them, and must be joined back before the capture ends.
#pragma once

#if HISPARSE_WITH_CUDA
#include <cuda_runtime_api.h>

#include <functional>

#include "core/stream.hpp"

namespace hisparse {

class CudaGraph {
 public:
  /// Captures what `enqueue` puts on `stream` (thread-local capture mode: a synchronising call
  /// from this thread fails the capture) and instantiates it. Throws Error when the capture
  /// fails, naming `what`; the stream is left out of capture mode either way.
  CudaGraph(const Stream& stream, const std::function<void()>& enqueue, const char* what);
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  ~CudaGraph();

  /// Enqueues one replay on `stream`.
  void launch(const Stream& stream) const;
  /// Nodes of the captured graph (kernels, copies, event records, ...).
  [[nodiscard]] std::size_t nodes() const noexcept { return nodes_; }

 private:
  cudaGraphExec_t exec_ = nullptr;
  std::size_t nodes_ = 0;
};

}  // namespace hisparse
#endif
