#include "report/results_file.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "bench/result_set.hpp"
#include "core/error.hpp"
#include "report/atomic_file.hpp"
#include "report/html_report.hpp"
#include "report/json_lookup.hpp"
#include "report/tables.hpp"

namespace hisparse {

using json_lookup::at;
using nlohmann::json;

json read_json_file(const std::filesystem::path& path, const std::string& fix) {
  const std::string where = path.string();
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error(where, "is a folder, not a JSON file", fix);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(where, fmt::format("cannot read the file ({})", std::strerror(errno)), fix);
  std::stringstream text;
  text << in.rdbuf();
  try {
    return json::parse(text.str());
  } catch (const json::exception& e) {  // parse_error; out_of_range for a number like 1e999
    std::string why = e.what();
    if (const auto p = why.find("] "); p != std::string::npos) why = why.substr(p + 2);
    throw Error(where, fmt::format("not valid JSON ({})", why), fix);
  }
}

bool is_results_document(const json& doc) {
  return doc.is_object() && at(doc, "schema_version").is_number_integer() &&
         at(doc, "points").is_array();
}

namespace {

void differences(const json& a, const json& b, const std::string& prefix,
                 std::vector<std::string>& out) {
  if (a.is_object() && b.is_object()) {
    for (const auto& [k, v] : a.items())
      differences(v, at(b, k.c_str()), prefix.empty() ? k : prefix + "." + k, out);
    for (const auto& [k, v] : b.items())
      if (!a.contains(k)) differences(json(), v, prefix.empty() ? k : prefix + "." + k, out);
    return;
  }
  if (a != b)
    out.push_back(fmt::format("{} ({} -> {})", prefix, a.is_null() ? "unset" : a.dump(),
                              b.is_null() ? "unset" : b.dump()));
}

}  // namespace

std::vector<std::string> scenario_differences(const json& a, const json& b,
                                              const std::vector<std::string>& ignored) {
  json x = a.is_object() ? a : json::object(), y = b.is_object() ? b : json::object();
  for (const auto& k : ignored) x.erase(k), y.erase(k);
  std::vector<std::string> out;
  differences(x, y, "", out);
  return out;
}

json load_results(const std::filesystem::path& path) {
  const std::string where = path.string();
  const char* fix = "give the path of a results.json written by 'hisparse-bench run'";
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error(where, "is a folder, not a results file", "give <folder>/results.json");
  json doc = read_json_file(path, fix);
  return checked_results(std::move(doc), where);
}

json checked_results(json doc, const std::string& where) {
  const char* fix = "give the path of a results.json written by 'hisparse-bench run'";
  const json& version = at(doc, "schema_version");
  if (!is_results_document(doc))
    throw Error(where, "not a hisparse-bench results file (no schema_version and points)", fix);
  if (version.get<int>() != kResultsSchemaVersion)
    throw Error(where,
                fmt::format("schema_version {} is not supported; this hisparse-bench reads "
                            "schema_version {}",
                            version.get<int>(), kResultsSchemaVersion),
                "use the hisparse-bench version that wrote it, or run the scenario again");
  return doc;
}

std::vector<std::filesystem::path> write_results_files(const json& results,
                                                       const std::filesystem::path& dir,
                                                       const std::vector<std::string>& formats) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw Error(dir.string(), "cannot create the output folder (" + ec.message() + ")",
                "choose a writable folder with --out DIR");
  std::vector<std::filesystem::path> written;
  for (const auto& f : formats) {
    std::filesystem::path path;
    std::string content;
    if (f == "json")
      path = dir / "results.json", content = results.dump(2) + "\n";
    else if (f == "csv")
      path = dir / "results.csv", content = results_csv(results);
    else if (f == "md")
      path = dir / "summary.md", content = results_markdown(results);
    else if (f == "html")
      path = dir / "report.html", content = html_report(results);
    else
      continue;
    write_file_atomically(path, content);
    written.push_back(path);
  }
  return written;
}

json merge_results(const std::vector<json>& documents, const std::vector<std::string>& labels) {
  if (documents.size() == 1) return documents.front();
  json merged = json::object();
  merged["schema_version"] =
      documents.empty() ? json(kResultsSchemaVersion) : at(documents.front(), "schema_version");
  merged["metadata"] = documents.empty() ? json::object() : at(documents.front(), "metadata");
  merged["scenario"] = documents.empty() ? json::object() : at(documents.front(), "scenario");
  merged["sources"] = json::array();
  merged["points"] = json::array();
  std::size_t planned = 0, recorded = 0, failed = 0;
  bool complete = true;
  for (std::size_t i = 0; i < documents.size(); ++i) {
    const json& d = documents[i];
    const json& meta = at(d, "metadata");
    merged["sources"].push_back(
        {{"label", i < labels.size() ? labels[i] : fmt::format("run {}", i + 1)},
         {"scenario", at(at(d, "scenario"), "name")},
         {"backend", at(meta, "backend")},
         {"device", at(at(meta, "device"), "name")},
         {"git_revision", at(meta, "git_revision")},
         {"start_time", at(meta, "start_time")},
         {"synthetic", at(meta, "synthetic")}});
    for (json p : at(d, "points")) {
      p["source"] = i;
      p["index"] = merged["points"].size();
      if (at(p, "status") != json("ok")) ++failed;
      merged["points"].push_back(std::move(p));
      ++recorded;
    }
    const json& summary = at(d, "summary");
    planned += at(summary, "planned").is_number_unsigned()
                   ? at(summary, "planned").get<std::size_t>()
                   : at(d, "points").size();
    complete = complete && at(summary, "complete") != json(false);
  }
  merged["summary"] = {{"planned", planned},
                       {"recorded", recorded},
                       {"ok", recorded - failed},
                       {"failed", failed},
                       {"complete", complete}};
  return merged;
}

}  // namespace hisparse
