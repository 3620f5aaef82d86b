#include "launch_floor_probe.hpp"

#include <stdexcept>

#include "core/cuda_check.hpp"
#include "kernels/common/dependent_launch.cuh"

namespace hisparse::microbench {
namespace {

// Lets the dependent kernel launch at once (as the swap-in's resolve does), then stores -1s.
__global__ void floor_first(std::int32_t* sink, int writes_per_block) {
  asm volatile("griddepcontrol.launch_dependents;");
  std::int32_t* out = sink + static_cast<std::int64_t>(blockIdx.x) *
                                 max(writes_per_block, static_cast<int>(blockDim.x));
  for (int i = static_cast<int>(threadIdx.x); i < writes_per_block;
       i += static_cast<int>(blockDim.x))
    out[i] = -1;
}

// Waits for the first kernel's stores (griddepcontrol.wait returns at once without PDL), then
// one store per block.
__global__ void floor_second(std::int32_t* sink) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (threadIdx.x == 0) sink[blockIdx.x] = static_cast<std::int32_t>(blockIdx.x);
}

// The jumps layout's skipped blocks run only where a chain's value equals this one, which in
// practice never happens (and costs a little extra work where it does, nothing wrong).
constexpr std::uint32_t kRareValue = 0x7fffffffu;

// Eight independent chains, so that issue, not dependent latency, sets the pace. Each step is
// x = x * x + k, one IMAD that ptxas cannot fold into its neighbours (it merges plain adds into
// three-input IADD3s).
__device__ __forceinline__ void eight_steps(std::uint32_t (&x)[8], std::uint32_t k) {
#pragma unroll
  for (int c = 0; c < 8; ++c) asm volatile("mad.lo.u32 %0, %0, %0, %1;" : "+r"(x[c]) : "r"(k));
}

// N multiply-adds as straight-line code, as N / 64 trips of a 64-step body, or as straight-line
// code that after every 64 steps jumps over a 64-step block it does not run, like a kernel's
// rare paths inline in its common one; the sum of the chains. The test reads the data (a uniform
// test of k alone could be threaded by the compiler into one jump around all of them).
template <int N, CodeLayout LAYOUT>
__device__ __forceinline__ std::uint32_t run_chains(std::uint32_t k) {
  static_assert(N % 64 == 0, "whole loop bodies");
  std::uint32_t x[8];
#pragma unroll
  for (int c = 0; c < 8; ++c) x[c] = threadIdx.x + c;
  if constexpr (LAYOUT == CodeLayout::loop) {
#pragma unroll 1
    for (int t = 0; t < N / 64; ++t) {
#pragma unroll
      for (int i = 0; i < 8; ++i) eight_steps(x, k);
    }
  } else {
#pragma unroll
    for (int t = 0; t < N / 64; ++t) {
#pragma unroll
      for (int i = 0; i < 8; ++i) eight_steps(x, k);
      if (LAYOUT == CodeLayout::jumps && x[0] == kRareValue) {
#pragma unroll
        for (int i = 0; i < 8; ++i) eight_steps(x, k + static_cast<std::uint32_t>(t));
      }
    }
  }
  std::uint32_t sum = 0;
#pragma unroll
  for (int c = 0; c < 8; ++c) sum += x[c];
  return sum;
}

template <int N, CodeLayout LAYOUT>
__global__ void code_fetch(std::int32_t* sink, std::uint32_t k) {
  sink[threadIdx.x] = static_cast<std::int32_t>(run_chains<N, LAYOUT>(k));
}

// Straight-line code of N multiply-adds on every block, for launch_code_cache_eviction. Only
// block 0 stores (every block computes the same values).
template <int N>
__global__ void evict_code(std::int32_t* sink, std::uint32_t k) {
  const std::uint32_t sum = run_chains<N, CodeLayout::straight>(k);
  if (blockIdx.x == 0) sink[threadIdx.x] = static_cast<std::int32_t>(sum);
}

template <int N>
void launch_code_fetch_layout(CodeLayout layout, dim3 block, std::int32_t* sink, std::uint32_t k,
                              cudaStream_t stream) {
  switch (layout) {
    case CodeLayout::straight:
      code_fetch<N, CodeLayout::straight><<<1, block, 0, stream>>>(sink, k);
      break;
    case CodeLayout::loop:
      code_fetch<N, CodeLayout::loop><<<1, block, 0, stream>>>(sink, k);
      break;
    case CodeLayout::jumps:
      code_fetch<N, CodeLayout::jumps><<<1, block, 0, stream>>>(sink, k);
      break;
  }
}

}  // namespace

void launch_code_fetch_kernel(const CodeFetchArgs& a, cudaStream_t stream) {
  const dim3 block(static_cast<unsigned>(a.threads));
  const std::uint32_t k = 3;
  if (a.instructions == 0)
    code_fetch<0, CodeLayout::straight><<<1, block, 0, stream>>>(a.sink, k);
  else if (a.instructions == 1024)
    launch_code_fetch_layout<1024>(a.layout, block, a.sink, k, stream);
  else if (a.instructions == 4096)
    launch_code_fetch_layout<4096>(a.layout, block, a.sink, k, stream);
  else
    throw std::invalid_argument("launch_code_fetch_kernel: instructions must be 0, 1024 or 4096");
  HISPARSE_CUDA_CHECK_LAUNCH();
}

void launch_code_cache_eviction(int blocks, std::int32_t* sink, cudaStream_t stream) {
  evict_code<kCodeEvictionBytes / 16><<<static_cast<unsigned>(blocks), 32, 0, stream>>>(sink, 5);
  HISPARSE_CUDA_CHECK_LAUNCH();
}

void launch_floor_kernels(const LaunchFloorArgs& a, cudaStream_t stream) {
  floor_first<<<static_cast<unsigned>(a.blocks), static_cast<unsigned>(a.threads), 0, stream>>>(
      a.sink, a.writes_per_block);
  HISPARSE_CUDA_CHECK_LAUNCH();
  if (a.nodes < 2) return;
  kernels::launch_dependent(floor_second, dim3(static_cast<unsigned>(a.blocks)),
                            dim3(static_cast<unsigned>(a.threads)), 0, stream, a.pdl, a.sink);
}

}  // namespace hisparse::microbench
