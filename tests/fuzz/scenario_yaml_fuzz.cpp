// Scenario YAML (parse_scenario, as `run` and `validate` read a scenario file): lines
// "#set key=value" of the input are also applied as --set overrides. A scenario that parses must
// count, expand (when small) and serialise its sweep.
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_target.hpp"
#include "scenario/scenario.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace hisparse;
  const std::string text = fuzz::as_text(data, size);
  std::vector<std::string> overrides;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("#set ", 0) == 0) overrides.push_back(line.substr(5));
  fuzz::fuzz_one([&] {
    // Model paths resolve against the scenarios folder, as for scenarios/*.yaml.
    const Scenario s = parse_scenario(text, "fuzz.yaml", overrides,
                                      std::filesystem::path(HISPARSE_SOURCE_DIR) / "scenarios");
    const std::size_t points = s.point_count();
    fuzz::check(points > 0, "a parsed scenario has no point");
    (void)s.skipped_count();
    if (points <= 4096)
      fuzz::check(s.expand().size() == points, "expand() disagrees with point_count()");
    (void)s.to_json().dump();
  });
  return 0;
}
