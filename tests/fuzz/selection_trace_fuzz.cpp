// Recorded selections of `policies` (read_selection_streams): a text trace, or an .npy of
// positions when the input starts with the .npy magic. Streams that read are replayed under
// every policy, as `policies` does, when their demand fits a small hot buffer.
#include <string_view>

#include "fuzz_target.hpp"
#include "hotcache/policy_study.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace hisparse;
  const bool npy =
      std::string_view(reinterpret_cast<const char*>(data), size).starts_with("\x93NUMPY");
  const auto file = fuzz::as_file(data, size, npy ? "selections.npy" : "selections.txt");
  fuzz::fuzz_one([&] {
    // The first recorded step's sequence length, as `policies --seq-len 1024` gives it.
    const auto streams = read_selection_streams(file, 1024, "--seq-len");
    constexpr int kHot = 64;
    if (streams.empty() || largest_demand(streams, kHot).slots > kHot) return;
    PolicyStudyOptions options;
    options.hots = {kHot};
    options.policies = {std::begin(kReplacementPolicies), std::end(kReplacementPolicies)};
    options.threads = 1;
    const PolicyStudy study = study_policies(streams, options);
    fuzz::check(study.cells.size() == options.policies.size(), "a policy was not replayed");
  });
  return 0;
}
