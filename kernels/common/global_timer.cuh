// The GPU's global timer (ns, the same clock on every SM), for diagnostic stamps in kernels: the
// swap-in's phase stamps and the Fathom staging copy's span.
#pragma once

namespace hisparse::kernels {

__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long ns = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

}  // namespace hisparse::kernels
