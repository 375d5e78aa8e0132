// loongforge-data end to end: preprocess gives byte-identical output for 1 and 2 workers (both
// used), documents round-trip, bad jsonl lines are errors with their line number, and the demo
// corpus -> preprocess -> inspect path the quickstart uses works.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "loongforge/data/demo_corpus.h"
#include "loongforge/data/indexed_dataset.h"
#include "multiprocess.h"

namespace {

std::string tool() { return lf::testing::binary_dir() + "/bin/loongforge-data"; }

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// About 1 MB of jsonl: documents of varied length and script, some empty.
std::vector<std::string> write_corpus(const std::string& path) {
  std::mt19937_64 rng(42);
  const std::vector<std::string> words = {"alpha", "beta", "γάμμα", "数据", "🚀", "x=1;", "\t", "\n",
                                          "Zürich", "tokens", "  ", "1234567"};
  std::vector<std::string> docs;
  std::ofstream out(path);
  size_t bytes = 0;
  while (bytes < 1000000) {
    std::string d;
    size_t n = rng() % 7 == 0 ? 0 : 1 + rng() % 400;
    for (size_t k = 0; k < n; ++k) d += words[rng() % words.size()] + (rng() % 3 ? " " : "");
    std::string line = nlohmann::json({{"id", docs.size()}, {"text", d}}).dump();
    out << line << "\n";
    bytes += line.size() + 1;
    docs.push_back(d);
  }
  return docs;
}

lf::testing::RankResult preprocess(const std::string& input, const std::string& prefix, int workers,
                                   std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {tool(), "preprocess", "--input", input, "--json-keys", "text",
                                   "--tokenizer-type", "ByteTokenizer", "--append-eod", "--workers",
                                   std::to_string(workers), "--output-prefix", prefix,
                                   "--chunk-bytes", "65536"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return lf::testing::run_command(argv);
}

TEST(Preprocess, TwoWorkersMatchOneByteForByteAndDocumentsRoundTrip) {
  std::string dir = lf::testing::make_temp_dir("pre_workers");
  auto docs = write_corpus(dir + "/in.jsonl");
  auto one = preprocess(dir + "/in.jsonl", dir + "/one", 1);
  ASSERT_TRUE(one.ok()) << one.output;
  auto two = preprocess(dir + "/in.jsonl", dir + "/two", 2);
  ASSERT_TRUE(two.ok()) << two.output;
  EXPECT_EQ(slurp(dir + "/one_text_document.idx"), slurp(dir + "/two_text_document.idx"));
  EXPECT_EQ(slurp(dir + "/one_text_document.bin"), slurp(dir + "/two_text_document.bin"));
  // Both workers took chunks (16 chunks of 64 KiB to share).
  EXPECT_NE(two.output.find("worker 0: "), std::string::npos) << two.output;
  EXPECT_EQ(two.output.find("worker 1: 0 chunks"), std::string::npos) << two.output;
  EXPECT_EQ(two.output.find("worker 0: 0 chunks"), std::string::npos) << two.output;

  lf::data::IndexedDataset ds(dir + "/two_text_document");
  EXPECT_EQ(ds.dtype(), lf::data::TokenDType::u16);
  size_t k = 0, empty = 0;
  for (const auto& d : docs) {
    if (d.empty()) {
      ++empty;
      continue;
    }
    ASSERT_LT(static_cast<int64_t>(k), ds.num_sequences());
    auto ids = ds.get(static_cast<int64_t>(k));
    ASSERT_EQ(ids.size(), d.size() + 1) << "document " << k;
    EXPECT_EQ(ids.back(), 256) << "eod";
    std::string text;
    for (size_t j = 0; j + 1 < ids.size(); ++j) text += static_cast<char>(ids[j]);
    ASSERT_EQ(text, d) << "document " << k;
    ++k;
  }
  EXPECT_EQ(static_cast<int64_t>(k), ds.num_sequences());
  EXPECT_EQ(ds.num_documents(), ds.num_sequences());
  EXPECT_GT(empty, 0u);
  EXPECT_NE(two.output.find("(" + std::to_string(empty) + " empty skipped)"), std::string::npos)
      << two.output;
}

TEST(Preprocess, BadLinesAreErrorsWithFileAndLineNumber) {
  std::string dir = lf::testing::make_temp_dir("pre_bad");
  std::ofstream(dir + "/bad.jsonl") << "{\"text\": \"ok\"}\n\n{\"text\": \"fine\"}\n{\"text\": oops}\n";
  auto r = preprocess(dir + "/bad.jsonl", dir + "/o", 2);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find(dir + "/bad.jsonl:4: malformed JSON line"), std::string::npos) << r.output;
  std::ofstream(dir + "/key.jsonl") << "{\"text\": \"ok\"}\n{\"body\": \"x\"}\n";
  r = preprocess(dir + "/key.jsonl", dir + "/o", 1);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find(dir + "/key.jsonl:2: no key \"text\""), std::string::npos) << r.output;
  std::ofstream(dir + "/num.jsonl") << "{\"text\": 5}\n";
  r = preprocess(dir + "/num.jsonl", dir + "/o", 1);
  EXPECT_NE(r.output.find("num.jsonl:1: key \"text\" holds number, not a string"), std::string::npos)
      << r.output;
  r = preprocess(dir + "/missing.jsonl", dir + "/o", 1);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("cannot open input " + dir + "/missing.jsonl"), std::string::npos) << r.output;
}

TEST(DemoCorpus, GeneratesHeldOutArithmeticThatPreprocessesAndInspects) {
  std::string dir = lf::testing::make_temp_dir("demo");
  auto r = lf::testing::run_command({tool(), "make-demo-corpus", "--out", dir + "/corpus", "--seed", "3",
                                     "--train-docs", "300", "--valid-docs", "20", "--problems-per-doc", "32"});
  ASSERT_TRUE(r.ok()) << r.output;
  // Held-out problems never occur in training text, and every eval answer is right.
  std::set<std::string> train_lines;
  std::ifstream train(dir + "/corpus/train.jsonl");
  int docs = 0;
  for (std::string line; std::getline(train, line); ++docs) {
    std::stringstream text(nlohmann::json::parse(line).at("text").get<std::string>());
    for (std::string p; std::getline(text, p);) train_lines.insert(p);
  }
  EXPECT_EQ(docs, 300);
  std::ifstream eval(dir + "/corpus/eval.jsonl");
  int evals = 0;
  for (std::string line; std::getline(eval, line); ++evals) {
    auto j = nlohmann::json::parse(line);
    std::string prompt = j.at("prompt");
    int a = 0, b = 0;
    char op = 0;
    ASSERT_EQ(std::sscanf(prompt.c_str(), "%d%c%d=", &a, &op, &b), 3) << prompt;
    EXPECT_TRUE(lf::data::demo_problem_held_out(a, op, b)) << prompt;
    EXPECT_EQ(std::stoi(j.at("answer").get<std::string>()), op == '+' ? a + b : a - b) << prompt;
    EXPECT_EQ(train_lines.count(j.at("text").get<std::string>().substr(0, j.at("text").get<std::string>().size() - 1)), 0u)
        << "held-out problem in training data: " << prompt;
  }
  EXPECT_EQ(evals, 500);
  EXPECT_GT(train_lines.size(), 5000u);
  // The quickstart's next steps: preprocess with the byte tokenizer, inspect.
  auto p = lf::testing::run_command({tool(), "preprocess", "--input", dir + "/corpus/train.jsonl",
                                     "--json-keys", "text", "--tokenizer-type", "byte", "--append-eod",
                                     "--workers", "2", "--output-prefix", dir + "/demo"});
  ASSERT_TRUE(p.ok()) << p.output;
  auto i = lf::testing::run_command({tool(), "inspect", dir + "/demo_text_document",
                                     "--tokenizer-type", "byte", "--max-tokens", "16"});
  ASSERT_TRUE(i.ok()) << i.output;
  for (const char* want : {"dtype: uint16 (code 8)", "sequences: 300", "documents: 300",
                           "token ids: all below 257", "length histogram:", "decoded: "})
    EXPECT_NE(i.output.find(want), std::string::npos) << want << "\n" << i.output;
}

// The quickstart's corpus: by default each document is one problem, as the prompt is later asked.
TEST(DemoCorpus, DefaultIsOneProblemPerDocument) {
  std::string dir = lf::testing::make_temp_dir("demo1");
  auto r = lf::testing::run_command({tool(), "make-demo-corpus", "--out", dir, "--seed", "3",
                                     "--train-docs", "50", "--valid-docs", "5"});
  ASSERT_TRUE(r.ok()) << r.output;
  std::ifstream train(dir + "/train.jsonl");
  int docs = 0;
  for (std::string line; std::getline(train, line); ++docs) {
    std::string text = nlohmann::json::parse(line).at("text");
    ASSERT_FALSE(text.empty());
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
    EXPECT_EQ(text.back(), '\n') << text;
  }
  EXPECT_EQ(docs, 50);
}

TEST(LoongforgeDataTool, UnknownTokenizerAndBadDatasetAreCleanErrors) {
  std::string dir = lf::testing::make_temp_dir("tool_err");
  std::ofstream(dir + "/x.jsonl") << "{\"text\": \"a\"}\n";
  auto r = lf::testing::run_command({tool(), "preprocess", "--input", dir + "/x.jsonl",
                                     "--tokenizer-type", "SentencePiece", "--output-prefix", dir + "/o"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("unknown --tokenizer-type \"SentencePiece\""), std::string::npos) << r.output;
  std::ofstream(dir + "/junk.idx") << "not an index at all, just some bytes here";
  std::ofstream(dir + "/junk.bin") << "";
  r = lf::testing::run_command({tool(), "inspect", dir + "/junk"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find(dir + "/junk.idx: bad magic"), std::string::npos) << r.output;
}

}  // namespace
