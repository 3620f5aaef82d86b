// hisparse-microbench: kernel microbenchmarks (Google Benchmark). GPU figures are timed with CUDA
// events around CUDA-graph replays (manual time); counters give bytes per second and the fraction
// of the PCIe ceiling measured on the device at start. Use --benchmark_filter to pick cases, e.g.
//   hisparse-microbench --benchmark_filter='swap_in/pool_gb:16/batch:64/hot:4096/row:656/'
#include <benchmark/benchmark.h>

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
