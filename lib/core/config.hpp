// Build configuration visible to every translation unit.
#pragma once

#ifndef HISPARSE_WITH_CUDA
#define HISPARSE_WITH_CUDA 0
#endif

// Functions shared verbatim by CUDA kernels and their CPU twins.
#if defined(__CUDACC__)
#define HISPARSE_HD __host__ __device__ __forceinline__
#else
#define HISPARSE_HD inline
#endif
