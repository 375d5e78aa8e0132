// Tokenizer tests: HF parity on >= 100 KB of varied text against the `tokenizers` package
// (the oracle trains the tokenizer.json files at test time), NFC against Python's unicodedata,
// the byte tokenizer, and errors for unsupported or malformed tokenizer.json files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loongforge/core/error.h"
#include "loongforge/data/hf_bpe_tokenizer.h"
#include "loongforge/data/indexed_dataset.h"
#include "loongforge/data/tokenizer.h"
#include "multiprocess.h"

namespace {

using lf::data::HfBpeTokenizer;
using nlohmann::json;

std::string python() { return lf::testing::source_dir() + "/.venv/bin/python"; }

// Runs the oracle once per process; returns its output directory.
const std::string& oracle_dir() {
  static const std::string dir = [] {
    std::string d = lf::testing::make_temp_dir("hf_oracle");
    auto r = lf::testing::run_command(
        {python(), lf::testing::source_dir() + "/tests/data/hf_tokenizer_oracle.py", d},
        {}, std::chrono::seconds(120));
    EXPECT_TRUE(r.ok()) << r.output;
    return d;
  }();
  return dir;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

std::vector<std::string> read_docs(const std::string& path) {
  std::vector<std::string> docs;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) docs.push_back(json::parse(line).at("text"));
  return docs;
}

void expect_parity(const std::string& variant) {
  const std::string& d = oracle_dir();
  auto docs = read_docs(d + "/docs.jsonl");
  json expected = read_json(d + "/expected.json").at(variant);
  HfBpeTokenizer tok(d + "/" + variant);  // the directory form of --tokenizer-model
  size_t bytes = 0, tokens = 0, mismatched = 0;
  ASSERT_EQ(docs.size(), expected["ids"].size());
  for (size_t i = 0; i < docs.size(); ++i) {
    auto want = expected["ids"][i].get<std::vector<int32_t>>();
    auto got = tok.encode(docs[i]);
    bytes += docs[i].size();
    tokens += want.size();
    if (got != want && mismatched++ < 3) {
      ADD_FAILURE() << variant << " doc " << i << " ids differ (" << got.size() << " vs HF "
                    << want.size() << ")\ntext: " << json(docs[i]).dump();
    }
    EXPECT_EQ(tok.decode(want), expected["decoded"][i].get<std::string>()) << variant << " doc " << i;
  }
  EXPECT_EQ(mismatched, 0u);
  EXPECT_GE(bytes, 100u * 1000) << "the parity corpus must be at least 100 KB";
  // add_special_tokens=True: the post-processor's template (Gemma's <bos>; none for byte-level).
  const auto& special = expected.at("ids_special");
  ASSERT_EQ(special.size(), 50u);
  for (size_t i = 0; i < special.size(); ++i)
    EXPECT_EQ(tok.encode_with_special_tokens(docs[i]), special[i].get<std::vector<int32_t>>())
        << variant << " doc " << i << " with special tokens";
  // Second pass hits the word cache; it must give the same ids.
  for (size_t i = 0; i < docs.size(); ++i)
    ASSERT_EQ(tok.encode(docs[i]), expected["ids"][i].get<std::vector<int32_t>>()) << "cached, doc " << i;
  std::printf("%s: %zu docs, %zu bytes, %zu tokens identical to HF\n", variant.c_str(), docs.size(),
              bytes, tokens);
}

TEST(HfTokenizer, QwenStyleMatchesHfIdsAndDecode) { expect_parity("qwen"); }
TEST(HfTokenizer, OldMergesFormatMatchesHf) { expect_parity("qwen_old"); }
TEST(HfTokenizer, Llama3StyleIgnoreMergesMatchesHf) { expect_parity("llama3"); }
TEST(HfTokenizer, GemmaStyleByteFallbackMatchesHf) { expect_parity("gemma"); }
TEST(HfTokenizer, Llama2StylePrependAndStripMatchesHf) { expect_parity("llama2"); }

TEST(HfTokenizer, Llama2StyleStripWithoutFuseMatchesHf) { expect_parity("llama2_unfused"); }

// Byte fallback with some byte tokens missing: a character whose bytes are not all tokens is <unk>,
// and HF holds that unk back until the next character in the vocabulary, so byte tokens that come
// between are emitted before it (and with fuse_unk the unknown characters around them fuse).
TEST(HfTokenizer, UnkAfterByteFallbackFollowsHfsOrder) {
  for (const char* variant : {"gemma_partial_bytes", "gemma_partial_bytes_unfused"}) {
    expect_parity(variant);
    HfBpeTokenizer tok(oracle_dir() + "/" + variant);
    const int32_t unk = *tok.token_to_id("<unk>");
    const int32_t byte0 = *tok.token_to_id("<0x00>");  // the oracle appends the 256 byte tokens in order
    // Texts with the case the order matters for: an unk right after a byte token.
    size_t held_back = 0;
    const json expected = read_json(oracle_dir() + "/expected.json");
    for (const auto& c : expected.at(variant).at("unk_cases")) {
      const auto want = c[1].get<std::vector<int32_t>>();
      EXPECT_EQ(tok.encode(c[0].get<std::string>()), want) << variant << " " << c[0].dump();
      for (size_t k = 1; k < want.size(); ++k) held_back += want[k] == unk && want[k - 1] >= byte0 && want[k - 1] < byte0 + 256;
    }
    EXPECT_GT(held_back, 2u) << variant << ": the cases never put an unk after a byte token";
  }
  // "a€é€b" in miniature: an emoji (no <0xF0>) then a character that falls back to bytes, then the
  // emoji again: HF gives the byte tokens first, then one unk (fused) or two (unfused).
  HfBpeTokenizer fused(oracle_dir() + "/gemma_partial_bytes"), unfused(oracle_dir() + "/gemma_partial_bytes_unfused");
  const std::string text = "\xf0\x9f\x90\x89\xea\x99\xae\xf0\x9f\x90\x89";  // 🐉ꙮ🐉
  const int32_t unk = *fused.token_to_id("<unk>");
  auto f = fused.encode(text), u = unfused.encode(text);
  ASSERT_GE(f.size(), 2u);
  EXPECT_EQ(f.back(), unk);
  EXPECT_EQ(std::count(f.begin(), f.end(), unk), 1);
  EXPECT_EQ(std::count(u.begin(), u.end(), unk), 2);
  EXPECT_NE(f.front(), unk);
}

// ByteFallback's runs of <0xXX> tokens: one U+FFFD per byte when the run is not UTF-8 (its valid
// bytes too), the text when it is; Strip on the fused text or, without Fuse, on every token.
TEST(HfTokenizer, SentencePieceStyleDecodeMatchesHf) {
  for (const char* variant : {"gemma", "llama2", "llama2_unfused", "gemma_eos"}) {
    HfBpeTokenizer tok(oracle_dir() + "/" + variant);
    const json cases = read_json(oracle_dir() + "/expected.json").at(variant).at("decode_cases");
    ASSERT_EQ(cases.size(), 7u) << variant;
    for (const auto& c : cases)
      EXPECT_EQ(tok.decode(c[0].get<std::vector<int32_t>>()), c[1].get<std::string>()) << variant << " " << c[0].dump();
  }
}

TEST(HfTokenizer, GemmaStyleWithEosSuffixMatchesHf) { expect_parity("gemma_eos"); }
TEST(HfTokenizer, NfcBeforeReplaceMatchesHf) { expect_parity("gemma_nfc"); }

// HF's truncation=True, max_length=N with add_special_tokens: the text is cut, the template's
// prefix and suffix (<eos> here) stay; N below the template's tokens is refused.
TEST(HfTokenizer, TruncationKeepsTheTemplateAsHf) {
  const auto docs = read_docs(oracle_dir() + "/docs.jsonl");
  const json expected = read_json(oracle_dir() + "/expected.json");
  for (const char* variant : {"gemma", "llama2", "gemma_eos"}) {
    HfBpeTokenizer tok(oracle_dir() + "/" + variant);
    const auto& cases = expected.at(variant).at("truncated");
    ASSERT_EQ(cases.size(), 6u) << variant;
    for (const auto& c : cases) {
      const int64_t n = c[0].get<int64_t>();
      for (size_t i = 0; i < c[1].size(); ++i)
        EXPECT_EQ(tok.encode_with_special_tokens(docs[i], n), c[1][i].get<std::vector<int32_t>>())
            << variant << " max_length " << n << " doc " << i;
    }
  }
  HfBpeTokenizer eos(oracle_dir() + "/gemma_eos");
  try {
    eos.encode_with_special_tokens("some text", 1);
    FAIL() << "a maximum length below the template's two tokens should be refused";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("below the 2 special tokens"), std::string::npos) << e.what();
  }
}

TEST(HfTokenizer, SentencePieceStyleSpecificsMatchHf) {
  HfBpeTokenizer gemma(oracle_dir() + "/gemma");
  EXPECT_NE(gemma.describe().find("SentencePiece-style BPE with byte fallback"), std::string::npos)
      << gemma.describe();
  // A character outside the vocabulary is its UTF-8 bytes' <0xXX> tokens, and decodes back.
  auto ids = gemma.encode("\xe4\xbd\xa0");  // 你
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[0], *gemma.token_to_id("<0xE4>"));
  EXPECT_EQ(gemma.decode(ids), "\xe4\xbd\xa0");
  EXPECT_EQ(gemma.encode_with_special_tokens("").size(), 1u);  // <bos> alone
}

// Token offsets of SentencePiece-style tokenizers (chat masks need them): HF's, in bytes, on the
// corpus: Replace's "▁" maps to its space, Prepend's to the first character, a byte-fallback token
// to its whole character, an NFC-composed character to its base; with byte tokens missing, the
// held-back unk where HF puts it.
TEST(HfTokenizer, SentencePieceStyleOffsetsMatchHf) {
  const json expected = read_json(oracle_dir() + "/expected.json");
  const auto docs = read_docs(oracle_dir() + "/docs.jsonl");
  for (const char* variant :
       {"gemma", "llama2", "gemma_eos", "gemma_nfc", "gemma_partial_bytes", "gemma_partial_bytes_unfused"}) {
    HfBpeTokenizer tok(oracle_dir() + "/" + variant);
    const auto& want = expected.at(variant).at("offsets");
    ASSERT_EQ(want.size(), 80u) << variant;
    size_t tokens = 0, differ = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      std::vector<int32_t> ids;
      std::vector<lf::data::ByteSpan> spans;
      tok.encode_with_offsets(docs[i], ids, spans);
      ASSERT_EQ(ids, expected.at(variant).at("ids")[i].get<std::vector<int32_t>>()) << variant << " doc " << i;
      ASSERT_EQ(spans.size(), ids.size()) << variant << " doc " << i;
      for (size_t k = 0; k < spans.size(); ++k, ++tokens) {
        const auto w = want[i][k].get<std::array<size_t, 2>>();
        if ((spans[k].begin != w[0] || spans[k].end != w[1]) && differ++ < 3)
          ADD_FAILURE() << variant << " doc " << i << " token " << k << ": [" << spans[k].begin << ", " << spans[k].end
                        << ") vs HF [" << w[0] << ", " << w[1] << ")";
      }
    }
    EXPECT_EQ(differ, 0u) << variant << ", " << tokens << " tokens";
  }
  // Added tokens keep their content's range between normalized segments.
  HfBpeTokenizer gemma(oracle_dir() + "/gemma");
  std::vector<int32_t> ids;
  std::vector<lf::data::ByteSpan> spans;
  gemma.encode_with_offsets("a<eos> b", ids, spans);
  ASSERT_EQ(ids.size(), spans.size());
  const auto eos = std::find(ids.begin(), ids.end(), *gemma.token_to_id("<eos>"));
  ASSERT_NE(eos, ids.end());
  const auto& e = spans[static_cast<size_t>(eos - ids.begin())];
  EXPECT_EQ(e.begin, 1u);
  EXPECT_EQ(e.end, 6u);
  EXPECT_EQ(spans.back().end, 8u);
}

// HF's added-token options: lstrip / rstrip take the whitespace (any Unicode \\s: tabs, newlines,
// U+00A0, U+3000) before / after a match into the token and its offsets; single_word leaves a match
// with a word character (letters of any script, digits, "_", combining marks) next to it as text.
// Whole-corpus parity (the Qwen-style corpus has chat tokens with whitespace around them), then
// each option against every kind of neighbour, byte-level and SentencePiece-style.
TEST(HfTokenizer, ConfigOnlySpecialTokensAreAddedAsTransformersAddsThem) {
  // tokenizer_config.json names bos "<s>", unk "<unk>", an lstrip mask "<mask>", an image token in
  // extra_special_tokens and a boi_token, all absent from tokenizer.json (new ids from the
  // vocabulary's size), and a pad token in the vocabulary but not among the added tokens (its id,
  // no longer split by BPE); transformers' ids and size.
  const json expected = read_json(oracle_dir() + "/expected.json").at("qwen_config_specials");
  HfBpeTokenizer tok(oracle_dir() + "/qwen_config_specials");
  EXPECT_EQ(tok.vocab_size(), expected.at("size").get<int64_t>());
  int with_specials = 0, k = 0;
  for (const auto& c : expected.at("cases")) {
    const auto want = c[1].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(c[0].get<std::string>()), want) << c[0].dump();
    if (k++ < 4) EXPECT_EQ(tok.decode(want), c[0].get<std::string>()) << c[0].dump();  // ASCII: no NFC change
    with_specials += std::any_of(want.begin(), want.end(), [&](int32_t id) { return id >= tok.vocab_size() - 5; });
  }
  EXPECT_EQ(with_specials, 4);
}

TEST(HfTokenizer, AddedTokenStripAndSingleWordMatchHf) {
  const json expected = read_json(oracle_dir() + "/expected.json");
  for (const char* variant : {"qwen_strip", "gemma_strip"}) {
    expect_parity(variant);
    HfBpeTokenizer tok(oracle_dir() + "/" + variant);
    size_t differ = 0, stripped = 0, kept_as_text = 0;
    for (const auto& c : expected.at(variant).at("strip_cases")) {
      const auto text = c[0].get<std::string>();
      const auto want = c[1].get<std::vector<int32_t>>();
      std::vector<int32_t> ids;
      std::vector<lf::data::ByteSpan> spans;
      tok.encode_with_offsets(text, ids, spans);
      if (ids != want && differ++ < 5) ADD_FAILURE() << variant << " " << c[0].dump() << ": ids differ from HF's";
      EXPECT_EQ(tok.encode(text), want) << variant << " " << c[0].dump();
      if (ids != want) continue;
      for (size_t k = 0; k < ids.size(); ++k) {
        if (!tok.added_token_content(ids[k])) continue;  // added tokens' spans (BPE tokens: other tests)
        const auto w = c[2][k].get<std::array<size_t, 2>>();
        EXPECT_EQ(spans[k].begin, w[0]) << variant << " " << c[0].dump() << " token " << k;
        EXPECT_EQ(spans[k].end, w[1]) << variant << " " << c[0].dump() << " token " << k;
        stripped += w[1] - w[0] > tok.added_token_content(ids[k])->size();
      }
      kept_as_text += std::count(text.begin(), text.end(), '<') >
                      static_cast<std::ptrdiff_t>(std::count_if(ids.begin(), ids.end(), [&](int32_t id) {
                        return tok.added_token_content(id).has_value();
                      }));
    }
    EXPECT_EQ(differ, 0u) << variant;
    // The cases exercise both options: tokens that took whitespace, matches left as text.
    EXPECT_GT(stripped, 20u) << variant;
    EXPECT_GT(kept_as_text, 20u) << variant;
  }
}

TEST(HfTokenizer, NfcMatchesUnicodedata) {
  const std::string& d = oracle_dir();
  HfBpeTokenizer tok(d + "/qwen/tokenizer.json");
  json cases = read_json(d + "/nfc.json");
  ASSERT_GT(cases.size(), 2000u);
  int bad = 0;
  for (const auto& c : cases) {
    std::string in = c[0], want = c[1];
    // The Qwen-style tokenizer normalises with NFC and its decode is exact, so this is NFC.
    std::string got = tok.decode(tok.encode(in));
    if (got != want && bad++ < 5) ADD_FAILURE() << "NFC of " << json(in).dump() << ": got "
                                                << json(got).dump() << ", want " << json(want).dump();
  }
  EXPECT_EQ(bad, 0);
}

TEST(HfTokenizer, SpecialTokensEodAndVocab) {
  const std::string& d = oracle_dir();
  HfBpeTokenizer tok(d + "/qwen");
  auto im_end = tok.token_to_id("<|im_end|>");
  auto eot = tok.token_to_id("<|endoftext|>");
  ASSERT_TRUE(im_end && eot);
  EXPECT_EQ(*eot, 0);  // trainer puts special tokens first
  EXPECT_EQ(tok.eod_id(), im_end) << "eos_token of tokenizer_config.json";
  EXPECT_EQ(tok.vocab_size(), 3000);
  HfBpeTokenizer no_config(d + "/qwen_old/tokenizer.json");
  EXPECT_EQ(no_config.eod_id(), eot) << "without a config the first well-known name is used";
  auto ids = tok.encode("a<|im_end|><|endoftext|>b");
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ(ids[1], *im_end);
  EXPECT_EQ(ids[2], *eot);
  // A clone shares the model and encodes identically.
  auto c = tok.clone();
  EXPECT_EQ(c->encode("héllo wörld 123"), tok.encode("héllo wörld 123"));
}

TEST(HfTokenizer, InvalidUtf8InputIsAnError) {
  HfBpeTokenizer tok(oracle_dir() + "/qwen");
  try {
    tok.encode(std::string("ok \xff bad"));
    FAIL() << "expected an error";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not valid UTF-8 at byte 3"), std::string::npos) << e.what();
  }
}

TEST(HfTokenizer, DecodeOfPartialBytesIsLossyLikeHf) {
  HfBpeTokenizer tok(oracle_dir() + "/qwen");
  auto ids = tok.encode("\xe4\xb8\xad");  // one CJK char = 3 bytes; byte-level ids per byte here
  std::vector<int32_t> first_byte;
  // The id of the byte-level char for 0xE4 alone.
  auto e4 = tok.token_to_id("\xc3\xa4");  // byte 0xE4 maps to U+00E4 'ä'
  ASSERT_TRUE(e4);
  first_byte.push_back(*e4);
  EXPECT_EQ(tok.decode(first_byte), "\xef\xbf\xbd");  // U+FFFD
  EXPECT_EQ(tok.decode(ids), "\xe4\xb8\xad");
}

void expect_load_error(const std::string& name, const std::function<void(json&)>& edit,
                       const std::string& needle, const std::string& base = "qwen") {
  json spec = read_json(oracle_dir() + "/" + base + "/tokenizer.json");
  edit(spec);
  std::string dir = lf::testing::make_temp_dir("bad_tok_" + name);
  std::string path = dir + "/tokenizer.json";
  std::ofstream(path) << spec.dump();
  try {
    HfBpeTokenizer tok(path);
    FAIL() << name << ": expected an error";
  } catch (const lf::Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find(needle), std::string::npos) << name << ": " << what;
    EXPECT_NE(what.find(path), std::string::npos) << name << " should name the file: " << what;
  }
}

TEST(HfTokenizer, UnsupportedOrMalformedFilesAreErrorsNamingTheFile) {
  expect_load_error("nfkc", [](json& j) { j["normalizer"] = {{"type", "NFKC"}}; },
                    "normalizer \"NFKC\" is not supported");
  expect_load_error("wordpiece", [](json& j) { j["model"]["type"] = "WordPiece"; },
                    "model type \"WordPiece\"");
  expect_load_error("byte_fallback", [](json& j) { j["model"]["byte_fallback"] = true; },
                    "decoder \"ByteLevel\" is not supported with a SentencePiece-style BPE");
  expect_load_error("replace_regex", [](json& j) {
    j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", "\\s"}}}, {"content", "_"}};
  }, "normalizer Replace with a regex pattern is not supported");
  expect_load_error("merge", [](json& j) { j["model"]["merges"][5] = "onlyone"; },
                    "merge 5 \"onlyone\" is not two tokens");
  expect_load_error("merge_vocab", [](json& j) { j["model"]["merges"][7] = {"zzzq", "qqq"}; },
                    "merge 7 (zzzq, qqq) uses a token missing from the vocab");
  expect_load_error("regex", [](json& j) {
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  }, "cannot compile the regex");
  expect_load_error("metaspace", [](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}}; },
                    "pre_tokenizer \"Metaspace\" is not supported");
  // normalized: true where the normalizer changes the token (LLaMA-2's Prepend makes "<eos>"
  // "▁<eos>", which HF matches only at the start of a segment): refused. Where it does not (the
  // qwen_normalized variant, NFC), the corpus matches HF (AddedTokensNormalizedTrueMatchHf).
  expect_load_error("normalized", [](json& j) { j["added_tokens"][1]["normalized"] = true; },
                    "' has normalized: true and the normalizer turns it into '\xe2\x96\x81<eos>'", "llama2");
}

TEST(HfTokenizer, AddedTokensNormalizedTrueMatchHf) { expect_parity("qwen_normalized"); }

TEST(ByteTokenizer, RoundTripsBytesAndHasEod) {
  auto tok = lf::data::make_tokenizer("ByteTokenizer", "");
  std::string s = "12+7=19\n\xe4\xb8\xad";
  auto ids = tok->encode(s);
  ASSERT_EQ(ids.size(), s.size());
  EXPECT_EQ(ids[0], '1');
  EXPECT_EQ(ids[8], 0xe4);
  EXPECT_EQ(tok->decode(ids), s);
  EXPECT_EQ(tok->vocab_size(), 257);
  EXPECT_EQ(tok->eod_id(), 256);
  EXPECT_EQ(tok->decode(std::vector<int32_t>{'a', 256}), "a<|endoftext|>");
  EXPECT_THROW(lf::data::make_tokenizer("SentencePiece", "x"), lf::Error);
}

}  // namespace

namespace {

// Preprocessing with --tokenizer-type HuggingFaceTokenizer writes HF's ids plus the eod.
TEST(HfTokenizer, PreprocessWritesHfIds) {
  const std::string& d = oracle_dir();
  std::string out = lf::testing::make_temp_dir("hf_pre") + "/p";
  auto r = lf::testing::run_command({lf::testing::binary_dir() + "/bin/loongforge-data", "preprocess",
                                     "--input", d + "/docs.jsonl", "--tokenizer-type",
                                     "HuggingFaceTokenizer", "--tokenizer-model", d + "/qwen",
                                     "--append-eod", "--workers", "2", "--output-prefix", out});
  ASSERT_TRUE(r.ok()) << r.output;
  json expected = read_json(d + "/expected.json").at("qwen");
  lf::data::IndexedDataset ds(out + "_text_document");
  int64_t eod = *HfBpeTokenizer(d + "/qwen").eod_id();
  int64_t k = 0;
  for (const auto& ids : expected["ids"]) {
    auto want = ids.get<std::vector<int64_t>>();
    if (want.empty()) continue;  // empty documents are skipped
    want.push_back(eod);
    ASSERT_EQ(ds.get(k), want) << "document " << k;
    ++k;
  }
  EXPECT_EQ(k, ds.num_sequences());
}

}  // namespace

namespace {
TEST(HfTokenizer, Gpt2StyleByteLevelRegexAndPrefixSpaceMatchesHf) { expect_parity("gpt2"); }
}  // namespace
