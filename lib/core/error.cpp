#include "core/error.hpp"

#include <fmt/format.h>

namespace hisparse {
namespace {
std::string compose(const std::string& where, const std::string& problem, const std::string& fix) {
  std::string msg = where.empty() ? problem : where + ": " + problem;
  if (!fix.empty()) msg += "; " + fix;
  return msg;
}
}  // namespace

Error::Error(std::string where, std::string problem, std::string fix)
    : std::runtime_error(compose(where, problem, fix)),
      where_(std::move(where)),
      problem_(std::move(problem)),
      fix_(std::move(fix)) {}

CudaError::CudaError(const char* call, const char* file, int line, int code,
                     const std::string& name, const std::string& description)
    : Error(fmt::format("{}:{}", file, line),
            fmt::format("{} failed with {} ({})", call, name, description),
            "check the driver and the device (nvidia-smi); rerun with --backend cpu to use the CPU "
            "backend"),
      code_(code) {}

}  // namespace hisparse
