// Helpers for program-level tests: paths of the built programs, and reading the fp32
// safetensors parameter dump loongforge-train writes when LOONGFORGE_DUMP_PARAMS is set (TP
// shards gathered into full tensors). Header-only, shared by tests/tools/*.cpp.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "multiprocess.h"

namespace lf::testing {

inline std::string bin(const std::string& name) { return lf::testing::binary_dir() + "/bin/" + name; }

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// name -> values, from the fp32 safetensors file loongforge-train writes at the end of training
// when LOONGFORGE_DUMP_PARAMS is set (TP shards gathered into full tensors).
inline std::map<std::string, std::vector<float>> read_params(const std::string& path) {
  std::string bytes = read_file(path);
  EXPECT_GE(bytes.size(), 8u) << path;
  if (bytes.size() < 8) return {};
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  const std::string header = bytes.substr(8, n);
  const char* data = bytes.data() + 8 + n;
  std::map<std::string, std::vector<float>> out;
  std::regex entry(R"re("([^"]+)":\{"dtype":"F32","shape":\[[0-9,]*\],"data_offsets":\[(\d+),(\d+)\]\})re");
  for (std::sregex_iterator it(header.begin(), header.end(), entry), end; it != end; ++it) {
    const size_t a = std::stoull((*it)[2]), b = std::stoull((*it)[3]);
    std::vector<float> v((b - a) / 4);
    std::memcpy(v.data(), data + a, b - a);
    out[(*it)[1]] = std::move(v);
  }
  return out;
}

inline double max_abs_diff(const std::map<std::string, std::vector<float>>& a,
                    const std::map<std::string, std::vector<float>>& b) {
  EXPECT_EQ(a.size(), b.size());
  EXPECT_FALSE(a.empty());
  double worst = 0;
  for (const auto& [name, va] : a) {
    auto it = b.find(name);
    if (it == b.end()) {
      ADD_FAILURE() << "missing " << name;
      continue;
    }
    EXPECT_EQ(va.size(), it->second.size()) << name;
    for (size_t i = 0; i < std::min(va.size(), it->second.size()); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(va[i]) - it->second[i]));
  }
  return worst;
}

// The parameter dump of a run; under pipeline parallelism one file per stage (path.pp<k>), merged.
inline std::map<std::string, std::vector<float>> read_dumped_params(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::exists(path)) return read_params(path);
  std::map<std::string, std::vector<float>> out;
  for (int k = 0; fs::exists(path + ".pp" + std::to_string(k)); ++k)
    for (auto& [name, v] : read_params(path + ".pp" + std::to_string(k))) out[name] = std::move(v);
  return out;
}

// One training run of a program test: its exit code and output, the metrics fields per logged
// iteration (values, and as text for bit comparisons) and where its parameters were dumped.
struct MetricsRun {
  int exit_code = -1;
  std::string output;
  std::vector<std::map<std::string, double>> steps;
  std::vector<std::string> lines;
  std::string params_path;
};

// loongforge-train with `args` (under loongforge-run --standalone when procs > 1), OMP 1 thread,
// metrics in dir/m.jsonl and the final parameters in dir/p.safetensors; `fields`: the metrics keys
// read, a regex alternation ("loss|grad_norm|iteration").
inline MetricsRun run_training(int procs, const std::string& dir, const std::vector<std::string>& args,
                             const std::string& fields) {
  std::filesystem::create_directories(dir);
  std::vector<std::string> argv;
  if (procs > 1) argv = {bin("loongforge-run"), "--standalone", "--nproc-per-node", std::to_string(procs)};
  argv.push_back(bin("loongforge-train"));
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"--metrics-file", dir + "/m.jsonl"});
  auto r = run_command(argv, {{"OMP_NUM_THREADS", "1"}, {"LOONGFORGE_DUMP_PARAMS", dir + "/p.safetensors"}},
                       std::chrono::seconds(300));
  MetricsRun out;
  out.exit_code = r.exit_code;
  out.output = r.output;
  std::ifstream in(dir + "/m.jsonl");
  const std::regex field("\"(" + fields + ")\": ([-0-9.eE+]+)");
  for (std::string line; std::getline(in, line);) {
    std::map<std::string, double> step;
    std::string canon;
    for (std::sregex_iterator it(line.begin(), line.end(), field), end; it != end; ++it) {
      step[(*it)[1]] = std::stod((*it)[2]);
      canon += (*it)[1].str() + "=" + (*it)[2].str() + " ";
    }
    out.steps.push_back(step);
    out.lines.push_back(canon);
  }
  out.params_path = dir + "/p.safetensors";
  return out;
}

// The demo corpus (two-digit sums, one per document, the byte tokenizer's end-of-document after
// each): a sequence of 64 tokens holds ~6 documents. Made once per test process.
inline std::string demo_corpus() {
  static const std::string dir = [] {
    const std::string d = lf::testing::make_temp_dir("corpus");
    auto g = lf::testing::run_command({bin("loongforge-data"), "make-demo-corpus", "--out", d, "--seed", "3",
                                       "--train-docs", "4000", "--valid-docs", "200"});
    EXPECT_EQ(g.exit_code, 0) << g.output;
    auto p = lf::testing::run_command({bin("loongforge-data"), "preprocess", "--input", d + "/train.jsonl",
                                       "--json-keys", "text", "--tokenizer-type", "ByteTokenizer", "--append-eod",
                                       "--workers", "1", "--output-prefix", d + "/train"});
    EXPECT_EQ(p.exit_code, 0) << p.output;
    return d + "/train_text_document";
  }();
  return dir;
}

}  // namespace lf::testing
