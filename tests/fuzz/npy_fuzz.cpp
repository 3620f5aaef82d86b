// .npy (parse_npy, as the replay loader and `policies` read captured tensors). An array that
// parses must hold its shape's elements, and convert.
#include "fuzz_target.hpp"
#include "model/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace hisparse;
  fuzz::fuzz_one([&] {
    const NpyArray a =
        parse_npy(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.npy");
    fuzz::check(a.data.size() == a.elements() * npy_item_size(a.type),
                "the data does not hold the shape's elements");
    fuzz::check(a.floats().size() == a.elements(), "floats() does not give every element");
    if (npy_is_integer(a.type)) {
      fuzz::check(a.integers().size() == a.elements(), "integers() does not give every element");
      if (a.elements() > 0) (void)a.integer(static_cast<std::size_t>(a.elements() - 1));
    }
  });
  return 0;
}
