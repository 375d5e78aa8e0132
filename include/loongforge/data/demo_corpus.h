// The demo corpus: generated arithmetic ("12+7=19\n") a small model can learn, with problems held
// out of training so validation loss and answer accuracy measure generalisation, not recall.
// Writes jsonl for `loongforge-data preprocess`; not a dataset format of its own.
#pragma once

#include <cstdint>
#include <string>

namespace lf::data {

struct DemoCorpusOptions {
  std::string out_dir;
  uint64_t seed = 1234;
  int64_t train_docs = 200000;
  int64_t valid_docs = 2000;
  int64_t eval_problems = 500;
  int problems_per_doc = 1;  // one problem per document: trained as the prompt is asked, alone
  int max_operand = 99;  // operands in [0, max_operand]; "+" and "-" (never negative)
};

struct DemoCorpusFiles {
  std::string train, valid, eval;  // paths
  int64_t train_problems = 0, heldout_problems = 0;  // distinct problems on each side
};

// train.jsonl: {"text": lines of training problems}. valid.jsonl: the same form over held-out
// problems only. eval.jsonl: {"prompt": "12+7=", "answer": "19", "text": "12+7=19\n"} per
// distinct held-out problem. A problem (a, op, b) is held out when a fixed hash of it is 0 mod 10,
// independent of the seed, so every corpus holds out the same problems.
DemoCorpusFiles write_demo_corpus(const DemoCorpusOptions& options);

// Whether the demo holds out problem a op b (op '+' or '-').
bool demo_problem_held_out(int a, char op, int b);

}  // namespace lf::data
