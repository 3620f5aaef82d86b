// tools/hisparse-bench/README.md against the real definitions: every subcommand, every flag of
// each (read from the built tool's --help, i.e. from the CLI11 app), every exit status its help
// names, every scenario key (scenario_key_paths()) and every model preset, mode and scenario
// (`list --json`) must be documented, so the reference cannot fall behind the code. And every
// relative link of the guide and the component READMEs must name a file that exists.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "scenario/overrides.hpp"
#include "support/run_command.hpp"

namespace hisparse::test {
namespace {

const std::string kReference = std::string(HISPARSE_SOURCE_DIR) + "/tools/hisparse-bench/README.md";

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string read_reference() {
  return read_file(kReference);
}

/// The first group of `entry` on each line of a CLI11 help section ("Options:", "Subcommands:"),
/// up to the blank line after it. Entries start with two spaces; wrapped descriptions are
/// indented further and do not match.
std::vector<std::string> help_entries(const std::string& help, const std::string& title,
                                      const std::regex& entry) {
  std::vector<std::string> found;
  std::istringstream in(help);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (!inside) {
      inside = line == title;
      continue;
    }
    if (line.empty()) break;
    std::smatch m;
    if (std::regex_search(line, m, entry)) found.push_back(m[1].str());
  }
  return found;
}

/// Long flags of a help text, `--help` left out (an entry names them as "-q,--quiet").
std::vector<std::string> help_flags(const std::string& help) {
  std::vector<std::string> flags;
  for (const auto& entry : help_entries(help, "Options:", std::regex(R"(^  (-[^ ]+))"))) {
    std::stringstream names(entry);
    for (std::string name; std::getline(names, name, ',');)
      if (name.rfind("--", 0) == 0 && name != "--help") flags.push_back(name);
  }
  return flags;
}

std::vector<std::string> help_subcommands(const std::string& help) {
  return help_entries(help, "Subcommands:", std::regex(R"(^  ([a-z][a-z-]*) )"));
}

/// Every number in the help's "Exit status: ..." sentence.
std::set<std::string> help_exit_codes(const std::string& help) {
  std::set<std::string> codes;
  const auto at = help.find("Exit status:");
  if (at == std::string::npos) return codes;
  const std::string sentence = help.substr(at, help.find('\n', at) - at);
  static const std::regex number(R"(\b\d+\b)");
  for (std::sregex_iterator it(sentence.begin(), sentence.end(), number), end; it != end; ++it)
    codes.insert(it->str());
  return codes;
}

/// The Markdown section whose heading line contains `title`: from that line to the next heading of
/// the same or a higher level. Empty when no heading contains it.
std::string doc_section(const std::string& doc, const std::string& title) {
  std::istringstream in(doc);
  std::string section;
  std::size_t level = 0;
  bool in_code = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("```", 0) == 0) in_code = !in_code;
    const std::size_t hashes = in_code ? 0 : line.find_first_not_of('#');
    const bool heading = hashes > 0 && hashes != std::string::npos && line[hashes] == ' ';
    if (level > 0 && heading && hashes <= level) break;
    if (level == 0 && heading && line.find(title) != std::string::npos) level = hashes;
    if (level > 0) section += line + "\n";
  }
  return section;
}

/// `name` written as code: a backtick, the name, then anything that cannot continue a name
/// (so `--top-k` does not stand for `--top`).
bool mentions_code(const std::string& text, const std::string& name) {
  const std::string start = "`" + name;
  for (auto at = text.find(start); at != std::string::npos; at = text.find(start, at + 1)) {
    const char next = at + start.size() < text.size() ? text[at + start.size()] : ' ';
    if (!(std::isalnum(static_cast<unsigned char>(next)) || next == '-' || next == '_' ||
          next == '.'))
      return true;
  }
  return false;
}

std::string list_missing(const std::vector<std::string>& missing) {
  std::string out;
  for (const auto& m : missing) out += "\n  " + m;
  return out;
}

TEST(CliReferenceDoc, EverySubcommandAndEachOfItsFlags) {
  const std::string doc = read_reference();
  ASSERT_FALSE(doc.empty()) << kReference << " is missing or empty";
  const auto top = run_bench("--help");
  ASSERT_EQ(top.exit_code, 0) << top.output;
  const auto subcommands = help_subcommands(top.output);
  ASSERT_GE(subcommands.size(), 10u) << "could not read the subcommands of:\n" << top.output;

  std::vector<std::string> missing;
  for (const auto& flag : help_flags(top.output))
    if (!mentions_code(doc, flag)) missing.push_back("hisparse-bench " + flag);
  for (const auto& sub : subcommands) {
    const auto help = run_bench(sub + " --help");
    ASSERT_EQ(help.exit_code, 0) << help.output;
    const std::string section = doc_section(doc, "`hisparse-bench " + sub);
    if (section.empty()) {
      missing.push_back("a section headed `hisparse-bench " + sub + " ...`");
      continue;
    }
    const auto flags = help_flags(help.output);
    EXPECT_FALSE(flags.empty()) << "no flags read from 'hisparse-bench " << sub << " --help'";
    for (const auto& flag : flags)
      if (!mentions_code(section, flag))
        missing.push_back(fmt::format("`{}` in the section of `hisparse-bench {}`", flag, sub));
  }
  EXPECT_TRUE(missing.empty()) << kReference << " does not document:" << list_missing(missing)
                               << "\nadd each (as `--flag ...` in its subcommand's section)";
}

TEST(CliReferenceDoc, EveryExitStatusTheHelpNames) {
  const std::string section = doc_section(read_reference(), "Exit codes");
  ASSERT_FALSE(section.empty()) << kReference << " has no section headed 'Exit codes'";
  std::set<std::string> codes = help_exit_codes(run_bench("--help").output);
  for (const auto& sub : help_subcommands(run_bench("--help").output))
    for (const auto& c : help_exit_codes(run_bench(sub + " --help").output)) codes.insert(c);
  ASSERT_TRUE(codes.count("2")) << "could not read the exit statuses from the help";
  std::vector<std::string> missing;
  for (const auto& c : codes)
    if (!mentions_code(section, c)) missing.push_back(fmt::format("`{}`", c));
  EXPECT_TRUE(missing.empty()) << kReference
                               << " 'Exit codes' does not list:" << list_missing(missing);
}

TEST(CliReferenceDoc, EveryScenarioKey) {
  const std::string section = doc_section(read_reference(), "Scenario keys");
  ASSERT_FALSE(section.empty()) << kReference << " has no section headed 'Scenario keys'";
  std::vector<std::string> missing;
  for (const auto& key : scenario_key_paths())
    if (!mentions_code(section, key)) missing.push_back(fmt::format("`{}`", key));
  EXPECT_TRUE(missing.empty()) << kReference
                               << " 'Scenario keys' does not document:" << list_missing(missing);
}

TEST(CliReferenceDoc, EveryModelPresetModeAndScenario) {
  const std::string doc = read_reference();
  const auto listed = run_bench("list --json");
  ASSERT_EQ(listed.exit_code, 0) << listed.output;
  const auto names = nlohmann::json::parse(listed.output);
  std::vector<std::string> missing;
  for (const auto& [what, heading] : {std::pair<std::string, std::string>{"models", "Models"},
                                      {"modes", "Modes"},
                                      {"scenarios", "Scenarios"}}) {
    const std::string section = doc_section(doc, heading);
    ASSERT_FALSE(section.empty()) << kReference << " has no section headed '" << heading << "'";
    ASSERT_FALSE(names.at(what).empty()) << what;
    for (const auto& name : names.at(what))
      if (!mentions_code(section, name.get<std::string>()))
        missing.push_back(fmt::format("`{}` in '{}'", name.get<std::string>(), heading));
  }
  EXPECT_TRUE(missing.empty()) << kReference << " does not document:" << list_missing(missing);
}

TEST(DocLinks, EveryRelativeLinkNamesAFile) {
  namespace fs = std::filesystem;
  const fs::path root = HISPARSE_SOURCE_DIR;
  std::vector<fs::path> docs{root / "README.md"};
  for (const char* dir : {"tools", "lib", "kernels"})
    for (const auto& e : fs::recursive_directory_iterator(root / dir))
      if (e.path().filename() == "README.md") docs.push_back(e.path());
  static const std::regex link(R"(\]\(([^)\s#]+)(#[^)\s]*)?\))");
  std::vector<std::string> missing;
  for (const auto& doc : docs) {
    std::istringstream in(read_file(doc));
    bool in_code = false;
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("```", 0) == 0) in_code = !in_code;
      if (in_code) continue;
      for (std::sregex_iterator it(line.begin(), line.end(), link), end; it != end; ++it) {
        const std::string target = (*it)[1].str();
        if (target.find("://") != std::string::npos) continue;
        if (!fs::exists(doc.parent_path() / target))
          missing.push_back(fmt::format("{}: {}", fs::relative(doc, root).string(), target));
      }
    }
  }
  EXPECT_GE(docs.size(), 5u);
  EXPECT_TRUE(missing.empty()) << "links to files that do not exist:" << list_missing(missing);
}

}  // namespace
}  // namespace hisparse::test
