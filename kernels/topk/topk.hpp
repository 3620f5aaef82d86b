// Row-wise top-k selection: for each row, the k positions with the largest scores among the
// first lengths[row] entries. Ties go to the lower position; NaN ranks below every number.
// Output: the selected positions in increasing order (so attention over them reads rows in the
// same order as dense attention would), then -1 for each missing entry when lengths[row] < k.
#pragma once

#include <cstdint>

#include "core/stream.hpp"

namespace hisparse::kernels {

struct TopkArgs {
  const float* scores = nullptr;          ///< [rows x stride]
  const std::int64_t* lengths = nullptr;  ///< [rows] candidates per row (<= stride)
  std::int32_t* out = nullptr;            ///< [rows x k]
  int rows = 0;
  std::int64_t stride = 0;
  int k = 0;
};

#if HISPARSE_WITH_CUDA
void launch_topk(const TopkArgs& args, cudaStream_t stream);
#endif
void topk_ref(const TopkArgs& args);

}  // namespace hisparse::kernels
