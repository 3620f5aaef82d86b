// results.json (load_results, as `compare`, `gate` and `report` read it), then what those
// commands do with a document that loads: compare it with itself on every metric, gate it
// against itself under the default gate, merge it, and render every view.
#include <string>
#include <vector>

#include "fuzz_target.hpp"
#include "report/compare.hpp"
#include "report/gate.hpp"
#include "report/html_report.hpp"
#include "report/results_file.hpp"
#include "report/tables.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace hisparse;
  const auto file = fuzz::as_file(data, size, "results.json");
  fuzz::fuzz_one([&] {
    const nlohmann::json doc = load_results(file);
    // Each use may refuse the document with its own Error; each is tried.
    fuzz::fuzz_one([&] { (void)results_csv(doc); });
    fuzz::fuzz_one([&] { (void)results_markdown(doc); });
    fuzz::fuzz_one([&] { (void)html_report(doc); });
    fuzz::fuzz_one([&] { (void)html_report(merge_results({doc, doc}, {"base", "new"})); });
    for (const auto& name : compare_metric_names())
      fuzz::fuzz_one([&] {
        CompareOptions options;
        options.metric = parse_compare_metric(name, "--metric");
        const GateOutcome c = compare_results(doc, doc, options, "base", "new");
        (void)comparison_text(c, options);
        (void)to_json(c).dump();
      });
    fuzz::fuzz_one([&] {
      GateBaseline baseline;
      baseline.name = "fuzz";
      baseline.metrics = default_gate_metrics(GateInputKind::results);
      const GateOutcome g = judge_documents(baseline, {doc}, {"base"}, {doc}, {"new"});
      (void)gate_text(g, true);
      (void)gate_markdown(g);
      (void)to_json(g).dump();
      (void)html_report(gate_overlay(g));
    });
  });
  return 0;
}
