// hisparse-bench: the main command-line tool. Parses flags and calls libhisparse; no algorithms.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <iostream>

#include "bench/ceilings.hpp"
#include "core/device.hpp"
#include "core/error.hpp"
#include "core/memory.hpp"

int main(int argc, char** argv) {
  using namespace hisparse;
  CLI::App app{"hisparse-bench: HiSparse and Fathom decode benchmarks"};
  app.require_subcommand(1);
  std::string backend = "auto";
  auto* info = app.add_subcommand("info", "Print the device and measure PCIe and HBM bandwidth");
  info->add_option("--backend", backend, "auto|cuda|cpu");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? exit_code::ok : exit_code::bad_input;
  }
  try {
    if (*info) {
      const Device device = Device::for_backend(resolve_backend(backend, "--backend"));
      const auto p = device.properties();
      fmt::print("device: {} ({}), memory {}\n", p.name, name_of(p.backend), format_bytes(p.total_memory));
      const auto c = measure_ceilings(device);
      fmt::print("h2d {:.1f} GB/s, d2h {:.1f} GB/s, hbm copy {:.1f} GB/s, host copy {:.1f} GB/s\n",
                 c.h2d_gbps, c.d2h_gbps, c.hbm_copy_gbps, c.host_copy_gbps);
    }
  } catch (const Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return exit_code::bad_input;
  }
  return exit_code::ok;
}
