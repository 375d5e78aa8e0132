// The arithmetic demo corpus: jsonl train/valid/eval files with a fixed held-out problem set.
#include "loongforge/data/demo_corpus.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "loongforge/core/error.h"
#include "random.h"

namespace lf::data {
namespace {

struct Problem {
  int a, b;
  char op;
  int answer() const { return op == '+' ? a + b : a - b; }
  std::string prompt() const { return lf::str(a, op, b, '='); }
  std::string line() const { return lf::str(prompt(), answer(), '\n'); }
};

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

void write_line(std::ofstream& out, const nlohmann::ordered_json& j) { out << j.dump() << '\n'; }

}  // namespace

bool demo_problem_held_out(int a, char op, int b) {
  uint64_t key = static_cast<uint64_t>(a) * 1000003u + static_cast<uint64_t>(b) * 7u + (op == '+' ? 1u : 2u);
  return splitmix64(key) % 10 == 0;
}

DemoCorpusFiles write_demo_corpus(const DemoCorpusOptions& o) {
  LF_CHECK(!o.out_dir.empty(), "make-demo-corpus needs --out");
  LF_CHECK(o.max_operand >= 1 && o.max_operand <= 100000, "--max-operand ", o.max_operand,
           " must be in [1, 100000]");
  LF_CHECK(o.problems_per_doc >= 1 && o.train_docs >= 1 && o.valid_docs >= 0 && o.eval_problems >= 0,
           "demo corpus sizes must be positive (problems per doc ", o.problems_per_doc,
           ", train docs ", o.train_docs, ")");
  std::vector<Problem> train, heldout;
  for (int a = 0; a <= o.max_operand; ++a)
    for (int b = 0; b <= o.max_operand; ++b)
      for (char op : {'+', '-'}) {
        if (op == '-' && b > a) continue;
        (demo_problem_held_out(a, op, b) ? heldout : train).push_back({a, b, op});
      }
  LF_CHECK(!heldout.empty() && !train.empty(), "--max-operand ", o.max_operand,
           " is too small to hold problems out");
  std::filesystem::create_directories(o.out_dir);
  DemoCorpusFiles f;
  f.train = (std::filesystem::path(o.out_dir) / "train.jsonl").string();
  f.valid = (std::filesystem::path(o.out_dir) / "valid.jsonl").string();
  f.eval = (std::filesystem::path(o.out_dir) / "eval.jsonl").string();
  f.train_problems = static_cast<int64_t>(train.size());
  f.heldout_problems = static_cast<int64_t>(heldout.size());

  std::mt19937_64 rng(o.seed);
  auto write_docs = [&](const std::string& path, const std::vector<Problem>& pool, int64_t docs) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    LF_CHECK(out.good(), "cannot create ", path);
    for (int64_t d = 0; d < docs; ++d) {
      std::string text;
      for (int k = 0; k < o.problems_per_doc; ++k)
        text += pool[static_cast<size_t>(bounded_draw(rng, pool.size()))].line();
      write_line(out, {{"text", text}});
    }
    LF_CHECK(out.good(), "failed writing ", path);
  };
  write_docs(f.train, train, o.train_docs);
  write_docs(f.valid, heldout, o.valid_docs);

  std::vector<Problem> order = heldout;
  fisher_yates(order, 0, order.size(), rng);
  std::ofstream eval(f.eval, std::ios::binary | std::ios::trunc);
  LF_CHECK(eval.good(), "cannot create ", f.eval);
  for (int64_t k = 0; k < std::min<int64_t>(o.eval_problems, static_cast<int64_t>(order.size())); ++k) {
    const Problem& p = order[static_cast<size_t>(k)];
    write_line(eval, {{"prompt", p.prompt()}, {"answer", std::to_string(p.answer())}, {"text", p.line()}});
  }
  LF_CHECK(eval.good(), "failed writing ", f.eval);
  return f;
}

}  // namespace lf::data
