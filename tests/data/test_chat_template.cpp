// Chat templates end to end: `loongforge-data render-chat` equals transformers' apply_chat_template
// (input_ids and assistant_masks, token for token) on Qwen2.5, Qwen3, Llama 3.x, Gemma 2 (over a
// SentencePiece-style tokenizer) and Phi-3.5 shipped templates and their {% generation %}-marked
// variants (tests/data/chat_template_oracle.py), and renders all 70 templates of
// tests/data/chat_templates to transformers' text or error;
// the rendering-based masks of the unmarked templates follow docs/data.md's rule and equal the
// marked variants' masks; preprocess --conversations is byte-identical for 1 and 3 workers,
// agrees with render-chat through SftDataset, and names the file and line of a bad conversation.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loongforge/core/error.h"
#include "loongforge/data/chat_template.h"
#include "loongforge/data/hf_bpe_tokenizer.h"
#include "loongforge/data/indexed_dataset.h"
#include "loongforge/data/sft_dataset.h"
#include "multiprocess.h"

namespace {

using nlohmann::json;

std::string tool() { return lf::testing::binary_dir() + "/bin/loongforge-data"; }
std::string python() { return lf::testing::source_dir() + "/.venv/bin/python"; }

// Runs the oracle once per process; returns its output directory.
const std::string& oracle_dir() {
  static const std::string dir = [] {
    std::string d = lf::testing::make_temp_dir("chat_oracle");
    auto r = lf::testing::run_command(
        {python(), lf::testing::source_dir() + "/tests/data/chat_template_oracle.py", d}, {},
        std::chrono::seconds(120));
    EXPECT_TRUE(r.ok()) << r.output;
    return d;
  }();
  return dir;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json read_json(const std::string& path) { return json::parse(slurp(path)); }

std::vector<json> read_jsonl(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

// render-chat over one oracle run's conversations; returns its output lines.
std::vector<json> render_chat(const json& run, const std::string& variant, std::vector<std::string> extra = {}) {
  const std::string& d = oracle_dir();
  std::string out = lf::testing::make_temp_dir("render_chat") + "/out.jsonl";
  std::vector<std::string> argv = {tool(), "render-chat", "--tokenizer-model", d + "/" + variant, "--input",
                                   d + "/" + run["conversations"].get<std::string>(), "--output", out};
  if (run["add_generation_prompt"].get<bool>()) argv.push_back("--add-generation-prompt");
  if (!run["kwargs"].empty()) argv.insert(argv.end(), {"--chat-template-kwargs", run["kwargs"].dump()});
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto r = lf::testing::run_command(argv);
  EXPECT_TRUE(r.ok()) << r.output;
  return read_jsonl(out);
}

std::string describe(const json& run) {
  return run["variant"].get<std::string>() + " add_generation_prompt=" + run["add_generation_prompt"].dump() +
         " kwargs=" + run["kwargs"].dump();
}

TEST(ChatTemplate, RenderChatEqualsTransformersOnMarkedTemplates) {
  json runs = read_json(oracle_dir() + "/expected.json");
  int compared = 0;
  for (const auto& run : runs) {
    std::string variant = run["variant"];
    if (variant.find("_marked") == std::string::npos) continue;
    auto got = render_chat(run, variant);
    ASSERT_EQ(got.size(), run["input_ids"].size()) << describe(run);
    for (size_t k = 0; k < got.size(); ++k) {
      EXPECT_EQ(got[k]["input_ids"], run["input_ids"][k]) << describe(run) << " conversation " << k;
      EXPECT_EQ(got[k]["assistant_masks"], run["masks"][k]) << describe(run) << " conversation " << k;
      ++compared;
    }
  }
  // qwen25 (1 kwargs set), qwen3 (2), llama3 (2), gemma2 (1: a SentencePiece-style tokenizer), phi35 (1);
  // agp both ways
  EXPECT_EQ(compared, 2 * 6 + 4 * 6 + 4 * 3 + 2 * 3 + 2 * 5);
}

TEST(ChatTemplate, RenderedMasksOfUnmarkedTemplatesFollowTheRuleAndEqualTheMarkedOnes) {
  json runs = read_json(oracle_dir() + "/expected.json");
  auto marked_run = [&](const json& run) -> const json& {
    for (const auto& r : runs)
      if (r["variant"] == run["variant"].get<std::string>() + "_marked" && r["kwargs"] == run["kwargs"] &&
          r["add_generation_prompt"] == run["add_generation_prompt"])
        return r;
    ADD_FAILURE() << "no marked run for " << describe(run);
    return run;
  };
  int equal_to_marked = 0;
  for (const auto& run : runs) {
    std::string variant = run["variant"];
    if (variant.find("_marked") != std::string::npos) continue;
    auto got = render_chat(run, variant);
    ASSERT_EQ(got.size(), run["input_ids"].size()) << describe(run);
    // Qwen3 with enable_thinking=false prompts "<think>\n\n</think>\n\n", so the rule starts the
    // last turns' answers after it, where the marked template starts at the turn header.
    bool thinking_off = run["kwargs"].contains("enable_thinking");
    for (size_t k = 0; k < got.size(); ++k) {
      EXPECT_EQ(got[k]["input_ids"], run["input_ids"][k]) << describe(run) << " conversation " << k;
      // transformers itself returns all zeros for a template without markers.
      EXPECT_EQ(std::count(run["masks"][k].begin(), run["masks"][k].end(), 1), 0);
      EXPECT_EQ(got[k]["assistant_masks"], run["rule_masks"][k]) << describe(run) << " conversation " << k;
      if (!thinking_off) {
        EXPECT_EQ(got[k]["assistant_masks"], marked_run(run)["masks"][k]) << describe(run) << " conversation " << k;
        ++equal_to_marked;
      }
    }
  }
  EXPECT_EQ(equal_to_marked, 2 * 6 + 2 * 6 + 4 * 3 + 2 * 3 + 2 * 5);
}

TEST(ChatTemplate, ShippedTemplatesRenderTheTextTransformersRenders) {
  // Gemma 2, Mistral Nemo and llama.cpp's DeepSeek-R1 besides the three above: the same text, or
  // the same error (a raise_exception message, a generator tojson cannot serialize, an undefined
  // content concatenated) for every conversation of the oracle, with and without the generation
  // prompt.
  // Ordered: the conversations' key order is what tojson prints.
  auto records = nlohmann::ordered_json::parse(slurp(oracle_dir() + "/rendered.json"));
  int texts = 0, errors = 0;
  for (const auto& rec : records) {
    std::string name = rec["template"];
    std::string source = slurp(lf::testing::source_dir() + "/tests/data/chat_templates/" + name);
    std::string what = name + " add_generation_prompt=" + rec["add_generation_prompt"].dump() + " kwargs=" +
                       rec["kwargs"].dump() + " " + rec["conversation"].dump().substr(0, 80);
    try {
      lf::data::ChatTemplate t(source, name, rec["special_tokens"].dump());
      if (!rec["kwargs"].empty()) t.set_template_kwargs(rec["kwargs"].dump());
      auto r = t.render(rec["conversation"].dump(), rec["add_generation_prompt"].get<bool>());
      if (!rec["error"].is_null()) {
        ADD_FAILURE() << what << ": rendered, transformers raised " << rec["error"];
        continue;
      }
      EXPECT_EQ(r.text, rec["text"].get<std::string>()) << what;
      ++texts;
    } catch (const lf::Error& e) {
      if (rec["text"].is_string()) {
        ADD_FAILURE() << what << ": " << e.what() << ", transformers rendered it";
        continue;
      }
      EXPECT_NE(e.message().find(rec["error"].get<std::string>()), std::string::npos)
          << what << ": " << e.message() << " vs transformers' " << rec["error"];
      ++errors;
    }
  }
  EXPECT_EQ(texts, 1688);
  EXPECT_EQ(errors, 482);
}

TEST(ChatTemplate, NamedTemplatesAndLoading) {
  const std::string& d = oracle_dir();
  // qwen3_marked's tokenizer_config.json holds a list: "default" (marked) and "plain".
  auto def = lf::data::ChatTemplate::from_tokenizer_dir(d + "/qwen3_marked");
  EXPECT_TRUE(def.has_generation_markers());
  auto plain = lf::data::ChatTemplate::from_tokenizer_dir(d + "/qwen3_marked", "plain");
  EXPECT_FALSE(plain.has_generation_markers());
  try {
    lf::data::ChatTemplate::from_tokenizer_dir(d + "/qwen3_marked", "nope");
    ADD_FAILURE() << "an unknown template name loaded";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no chat template named \"nope\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("default, plain"), std::string::npos) << e.what();
  }
  // render-chat --chat-template-name plain gives the unmarked template's rendering-based masks.
  json runs = read_json(d + "/expected.json");
  for (const auto& run : runs)
    if (run["variant"] == "qwen3" && run["kwargs"].empty() && !run["add_generation_prompt"].get<bool>()) {
      auto got = render_chat(run, "qwen3_marked", {"--chat-template-name", "plain"});
      ASSERT_EQ(got.size(), run["rule_masks"].size());
      for (size_t k = 0; k < got.size(); ++k) EXPECT_EQ(got[k]["assistant_masks"], run["rule_masks"][k]);
    }
  // llama3's bos_token is an AddedToken dict; the template starts with it.
  auto llama = lf::data::ChatTemplate::from_tokenizer_dir(d + "/llama3");
  auto r = llama.render(R"({"messages": [{"role": "user", "content": "hi"}]})", false);
  EXPECT_EQ(r.text.rfind("<|begin_of_text|><|start_header_id|>system<|end_header_id|>", 0), 0u) << r.text;
  // No template at all: a clear error naming the directory.
  std::string empty = lf::testing::make_temp_dir("no_template");
  std::ofstream(empty + "/tokenizer_config.json") << "{}";
  try {
    lf::data::ChatTemplate::from_tokenizer_dir(empty);
    ADD_FAILURE() << "a directory without a template loaded";
  } catch (const lf::Error& e) {
    EXPECT_NE(e.message().find("has no chat template"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, TokenOffsetsCoverTheText) {
  lf::data::HfBpeTokenizer tok(oracle_dir() + "/qwen3");
  // NFC rewrites "e\u0301" to "é"; the other tokens keep exact byte offsets.
  std::string text = "<|im_start|>user\nCafe\xcc\x81 \xe4\xbd\xa0\xe5\xa5\xbd 😀<|im_end|>\n";
  std::vector<int32_t> ids;
  std::vector<lf::data::ByteSpan> spans;
  tok.encode_with_offsets(text, ids, spans);
  EXPECT_EQ(ids, tok.encode(text));
  ASSERT_EQ(ids.size(), spans.size());
  EXPECT_EQ(spans.front(), (lf::data::ByteSpan{0, 12}));  // <|im_start|>
  EXPECT_EQ(spans.back().end, text.size());
  for (size_t k = 1; k < spans.size(); ++k) {
    EXPECT_LE(spans[k - 1].end, spans[k].begin == spans[k - 1].begin ? spans[k - 1].end : spans[k].begin);
    EXPECT_LE(spans[k].begin, spans[k].end);
  }
  auto im_end = tok.token_to_id("<|im_end|>");
  ASSERT_TRUE(im_end.has_value());
  EXPECT_EQ(tok.added_token_content(*im_end), std::optional<std::string>("<|im_end|>"));
  EXPECT_EQ(tok.added_token_content(ids[2]), std::nullopt);
}

std::string write_conversations(const std::string& dir, int copies) {
  std::string src = slurp(oracle_dir() + "/conversations_qwen.jsonl");
  std::string path = dir + "/conversations.jsonl";
  std::ofstream out(path);
  for (int k = 0; k < copies; ++k) out << src << "\n";  // blank lines in between are skipped
  return path;
}

lf::testing::RankResult preprocess(const std::string& input, const std::string& prefix, int workers,
                                   const std::string& variant = "qwen3") {
  return lf::testing::run_command({tool(), "preprocess", "--conversations", "--tokenizer-model",
                                   oracle_dir() + "/" + variant, "--input", input, "--output-prefix", prefix,
                                   "--workers", std::to_string(workers), "--chunk-bytes", "4096",
                                   "--chat-template-kwargs", R"({"enable_thinking": false})"});
}

TEST(ChatPreprocess, ConversationsAreByteIdenticalForOneAndThreeWorkersAndEqualRenderChat) {
  std::string dir = lf::testing::make_temp_dir("chat_pre");
  std::string input = write_conversations(dir, 20);
  auto one = preprocess(input, dir + "/one", 1);
  ASSERT_TRUE(one.ok()) << one.output;
  auto three = preprocess(input, dir + "/three", 3);
  ASSERT_TRUE(three.ok()) << three.output;
  for (const char* f : {"_input_ids_document.bin", "_input_ids_document.idx", "_assistant_masks_document.bin",
                        "_assistant_masks_document.idx"})
    EXPECT_EQ(slurp(dir + "/one" + f), slurp(dir + "/three" + f)) << f;
  EXPECT_EQ(three.output.find("worker 2: 0 chunks"), std::string::npos) << three.output;

  auto rc = lf::testing::run_command({tool(), "render-chat", "--tokenizer-model", oracle_dir() + "/qwen3", "--input",
                                      input, "--output", dir + "/rc.jsonl", "--chat-template-kwargs",
                                      R"({"enable_thinking": false})"});
  ASSERT_TRUE(rc.ok()) << rc.output;
  auto want = read_jsonl(dir + "/rc.jsonl");
  lf::data::SftDataset ds(dir + "/three");
  ASSERT_EQ(ds.size(), static_cast<int64_t>(want.size()));
  ASSERT_EQ(ds.size(), 20 * 6);
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  int64_t answer_tokens = 0;
  for (int64_t i = 0; i < ds.size(); ++i) {
    ds.read(i, tokens, mask);
    EXPECT_EQ(ds.length(i), static_cast<int64_t>(tokens.size()));
    EXPECT_EQ(json(tokens), want[static_cast<size_t>(i)]["input_ids"]) << i;
    EXPECT_EQ(json(mask), want[static_cast<size_t>(i)]["assistant_masks"]) << i;
    for (uint8_t m : mask) answer_tokens += m;
  }
  EXPECT_GT(answer_tokens, 0);
  lf::data::IndexedDataset masks(lf::data::SftDataset::masks_prefix(dir + "/three"));
  EXPECT_EQ(masks.dtype(), lf::data::TokenDType::u8);
  // inspect reads both files.
  for (const char* name : {"/three_input_ids_document", "/three_assistant_masks_document"}) {
    auto ins = lf::testing::run_command({tool(), "inspect", dir + name});
    EXPECT_TRUE(ins.ok()) << ins.output;
    EXPECT_NE(ins.output.find("120"), std::string::npos) << ins.output;
  }
}

TEST(ChatPreprocess, BadConversationsNameTheFileAndLine) {
  std::string dir = lf::testing::make_temp_dir("chat_bad");
  struct Case {
    std::string line, variant, want;
  };
  std::vector<Case> cases = {
      {"{\"messages\": [", "qwen3", "the conversation is not valid JSON"},
      {R"({"conversation": []})", "qwen3", "the conversation has no \"messages\""},
      {R"({"messages": []})", "qwen3", "\"messages\" is empty"},
      // Llama 3's template raises on two tool calls in one message.
      {R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [)"
       R"({"function": {"name": "a", "arguments": {}}}, {"function": {"name": "b", "arguments": {}}}]}]})",
       "llama3", "the template raised an error: This model only supports single tool-calls at once!"},
  };
  for (const auto& c : cases) {
    // Six good conversations, the bad one on line 7, then more good ones.
    std::string good = slurp(oracle_dir() + "/conversations_qwen.jsonl");
    if (c.variant == "llama3") good = slurp(oracle_dir() + "/conversations_llama.jsonl") + "\n\n\n";
    std::string input = dir + "/bad.jsonl";
    std::ofstream(input) << good << c.line << "\n" << good;
    for (const char* cmd : {"preprocess", "render-chat"}) {
      lf::testing::RankResult r =
          std::string(cmd) == "preprocess"
              ? preprocess(input, dir + "/out", 2, c.variant)
              : lf::testing::run_command({tool(), "render-chat", "--tokenizer-model", oracle_dir() + "/" + c.variant,
                                          "--input", input, "--output", dir + "/out.jsonl"});
      EXPECT_EQ(r.exit_code, 1) << cmd << ": " << r.output;
      EXPECT_NE(r.output.find(input + ":7: "), std::string::npos) << cmd << ": " << r.output;
      EXPECT_NE(r.output.find(c.want), std::string::npos) << cmd << ": " << r.output;
    }
  }
  // Flags that do not apply to conversations are refused, not ignored.
  auto r = lf::testing::run_command({tool(), "preprocess", "--conversations", "--tokenizer-model",
                                     oracle_dir() + "/qwen3", "--input", dir + "/bad.jsonl", "--output-prefix",
                                     dir + "/o", "--append-eod"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--append-eod does not apply to --conversations"), std::string::npos) << r.output;
}

TEST(SftDataset, MismatchedFilesNameTheFile) {
  std::string dir = lf::testing::make_temp_dir("sft_mismatch");
  std::string p = dir + "/d";
  {
    lf::data::IndexedDatasetBuilder toks(lf::data::SftDataset::tokens_prefix(p), lf::data::TokenDType::u16, 100);
    lf::data::IndexedDatasetBuilder masks(lf::data::SftDataset::masks_prefix(p), lf::data::TokenDType::u8, 2);
    std::vector<int32_t> t = {1, 2, 3}, m = {0, 1};
    toks.add_sequence(t);
    toks.end_document();
    masks.add_sequence(m);
    masks.end_document();
    toks.finalize();
    masks.finalize();
  }
  try {
    lf::data::SftDataset ds(p);
    ADD_FAILURE() << "mismatched lengths were accepted";
  } catch (const lf::Error& e) {
    EXPECT_NE(e.message().find(p + "_assistant_masks_document.idx: conversation 0 has 2 mask values but " + p +
                               "_input_ids_document.idx has 3 tokens"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
