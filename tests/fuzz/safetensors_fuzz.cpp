// Safetensors (read_safetensors_index, then every tensor's bytes and floats, as the weights and
// replay loaders read them). The input is the whole file.
#include "fuzz_target.hpp"
#include "model/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace hisparse;
  const auto file = fuzz::as_file(data, size, "input.safetensors");
  fuzz::fuzz_one([&] {
    const SafetensorsIndex index = read_safetensors_index(file);
    for (const auto& t : index.tensors) {
      fuzz::check(t.begin <= t.end && index.data_start + t.end <= size,
                  "a tensor's data_offsets lie outside the file");
      fuzz::check(read_safetensors_bytes(index, t).size() == t.end - t.begin,
                  "a tensor's bytes differ from its data_offsets");
      // Only the float types convert; integers are refused with an Error.
      (void)read_safetensors_floats(index, t);
    }
  });
  return 0;
}
