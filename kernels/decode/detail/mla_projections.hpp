// The tensor-core kernels of MLA's absorbed projections (mla_projections.cu), which
// launch_mla_absorb and launch_mla_up_project call when they are given bf16 weights.
#pragma once

#include "kernels/decode/decode_ops.hpp"

#if HISPARSE_WITH_CUDA
namespace hisparse::kernels::detail {

void launch_mla_absorb_tensor_cores(const MlaAbsorbArgs& args, cudaStream_t stream);
void launch_mla_up_project_tensor_cores(const MlaUpProjectArgs& args, cudaStream_t stream);

}  // namespace hisparse::kernels::detail
#endif
