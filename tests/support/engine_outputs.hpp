// What engine tests compare between modes: the attention outputs of the last step.
#pragma once

#include <vector>

#include "model/decode_engine.hpp"

namespace hisparse::test {

/// The last step's attention outputs of every layer, concatenated in layer order.
inline std::vector<float> all_layers_attention(const DecodeEngine& engine) {
  std::vector<float> all;
  for (int l = 0; l < engine.model().layers; ++l) {
    const auto a = engine.last_attention(l);
    all.insert(all.end(), a.begin(), a.end());
  }
  return all;
}

}  // namespace hisparse::test
