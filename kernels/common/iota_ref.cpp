#include "kernels/common/iota.hpp"

namespace hisparse::kernels {
void iota_ref(const IotaArgs& args) {
  for (std::size_t i = 0; i < args.n; ++i)
    args.out[i] = args.start + static_cast<float>(i) * args.step;
}
}  // namespace hisparse::kernels
