// Launcher of the cluster resolve (ResolvePath::cluster; swap_in_cluster.cu). Internal to the
// swap-in: launch_swap_in_resolve calls it for the calls it can take.
#pragma once

#include "kernels/hotcache/swap_in.hpp"

namespace hisparse::kernels {

#if HISPARSE_WITH_CUDA
/// The shared-memory layout a launch of `args` uses (staging only with MissPlan::fetched and
/// rows of whole 16-B vectors).
[[nodiscard]] SwapInClusterLayout swap_in_cluster_launch_layout(const SwapInArgs& args);
/// Whether launch_swap_in_resolve runs the cluster kernel for `args`: ResolvePath::cluster, a
/// batch below kLargeBatch, the plan in miss order, no phase stamps and a shape that fits.
[[nodiscard]] bool swap_in_uses_cluster(const SwapInArgs& args);
/// Raises the cluster kernel's dynamic shared-memory limit (outside stream capture).
void configure_swap_in_cluster();
void launch_swap_in_resolve_cluster(const SwapInArgs& args, cudaStream_t stream);
#endif

}  // namespace hisparse::kernels
