// loongforge-config-docs [--check] [FILE]: regenerates the blocks of docs/configuration.md that
// come from the code (the flag table and the job schema), so the reference cannot drift.
// --check only compares (exit 1 when stale). Not a documentation generator for anything else.
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "loongforge/core/config/flags.h"
#include "loongforge/core/config/job_config.h"

namespace {

// Replaces the text between "<!-- name:begin -->\n" and "<!-- name:end -->"; false when the
// markers are missing.
bool replace_block(std::string& doc, const std::string& name, const std::string& body) {
  const std::string begin = "<!-- " + name + ":begin -->\n", end = "<!-- " + name + ":end -->";
  size_t b = doc.find(begin);
  size_t e = doc.find(end);
  if (b == std::string::npos || e == std::string::npos || e < b) return false;
  doc.replace(b + begin.size(), e - b - begin.size(), body);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  bool check = false;
  std::string file = LOONGFORGE_DOCS_FILE;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--check") {
      check = true;
    } else if (a == "--help" || a == "-h") {
      std::cout << "usage: loongforge-config-docs [--check] [FILE]\n  default FILE: " << file << "\n";
      return 0;
    } else {
      file = a;
    }
  }
  std::ifstream in(file);
  if (!in) {
    std::cerr << "loongforge-config-docs: cannot read " << file << "\n";
    return 2;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string before = ss.str();
  std::string after = before;
  for (const auto& [name, body] : {std::pair<std::string, std::string>{"flags", lf::config::flags_markdown()},
                                   {"schema", lf::config::job_fields_markdown()}}) {
    if (!replace_block(after, name, body)) {
      std::cerr << "loongforge-config-docs: " << file << " lacks the <!-- " << name << ":begin --> / <!-- "
                << name << ":end --> markers\n";
      return 2;
    }
  }
  if (check) {
    if (after == before) return 0;
    std::cerr << file << " is stale: run loongforge-config-docs to regenerate it\n";
    return 1;
  }
  if (after != before) {
    std::ofstream(file) << after;
    std::cout << "updated " << file << "\n";
  } else {
    std::cout << file << " is up to date\n";
  }
  return 0;
}
