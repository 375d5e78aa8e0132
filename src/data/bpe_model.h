// The immutable part of an HfBpeTokenizer, loaded from tokenizer.json (internal): vocabulary,
// merge table, added tokens, normalizer and pre-tokenizer steps. Shared by clones; encoding state
// (caches, regex match data) lives in each tokenizer instance.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "pcre_regex.h"

namespace lf::data::detail {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// One pre-tokenizer step, applied to every piece the previous step produced.
struct PreTokenizerStep {
  enum class Kind { split, byte_level } kind = Kind::split;
  std::shared_ptr<const CompiledRegex> regex;  // split; byte_level with use_regex (GPT-2's)
  bool add_prefix_space = false;               // byte_level
  bool merged_with_previous = false;           // split: a match ends the piece before it (else Isolated)
};

// A normalizer step besides NFC: Replace (a literal pattern) or Prepend.
struct NormalizeStep {
  enum class Kind { nfc, replace, prepend } kind = Kind::nfc;
  std::string pattern, content;  // replace: pattern -> content; prepend: content
};

struct Merge {
  int32_t rank;
  int32_t new_id;
};

struct AddedToken {
  std::string content;
  int32_t id;
  bool special;
  // HF's AddedToken options: lstrip / rstrip take the whitespace (\s) before / after a match into
  // the token; single_word drops a match with a word character (\w) right before or after it.
  bool lstrip = false, rstrip = false, single_word = false;
  bool normalized = false;  // HF matches it in the normalized text (see HfBpeTokenizer's constructor)
};

struct BpeModel {
  std::string path;
  StringMap<int32_t> vocab;           // token as written in tokenizer.json (byte-level chars)
  StringMap<int32_t> raw_vocab;       // the same tokens as raw bytes (ignore_merges lookups)
  std::array<int32_t, 256> byte_id{};  // initial symbol of each byte (-1: not in the vocabulary)
  std::unordered_map<uint64_t, Merge> merges;  // key: (left id << 32) | right id
  bool ignore_merges = false;
  bool nfc = false;  // the normalizer is NFC alone (norm then holds nothing else)
  // SentencePiece-style BPE (Gemma, LLaMA-2: model.byte_fallback, no ByteLevel step): symbols
  // are Unicode characters, a character missing from the vocabulary becomes its bytes' <0xXX>
  // tokens (byte_fallback) or the unk token; vocabulary tokens are plain UTF-8.
  bool spm = false;
  bool byte_fallback = false;
  std::array<int32_t, 256> fallback_id{};  // <0xXX> of each byte (-1: missing)
  std::optional<int32_t> unk;              // model.unk_token's id
  bool fuse_unk = false;
  std::vector<NormalizeStep> norm;  // in order, when the normalizer has Replace or Prepend steps
  // Decoding (spm): "▁" -> " " per the decoder's Replace; ByteFallback's <0xXX> tokens
  // (id_is_byte) joined into runs, a run that is not UTF-8 one U+FFFD per byte; leading spaces
  // stripped by Strip, from the fused text or (no Fuse before Strip) from every token.
  int strip_start = 0;
  bool strip_each_token = false;
  std::vector<uint8_t> id_is_byte;
  // The post-processor's single-sequence template (TemplateProcessing): ids before and after
  // the text; template_error says why there is none usable ("" when fine).
  std::vector<int32_t> template_prefix, template_suffix;
  std::string template_error;
  std::vector<PreTokenizerStep> steps;
  std::vector<AddedToken> added;
  // Trie over added-token bytes for leftmost-longest matching; node 0 is the root.
  struct TrieNode {
    std::vector<std::pair<unsigned char, int32_t>> next;
    int32_t token = -1;  // index into added
  };
  std::vector<TrieNode> trie;
  std::array<bool, 256> added_first_byte{};
  std::vector<std::string> id_bytes;  // what decode emits for each id
  std::vector<std::string> id_token;  // token text for each id ("" if unused)
  int64_t vocab_size = 0;
  std::optional<int32_t> eod;

  const Merge* find_merge(int32_t a, int32_t b) const {
    auto it = merges.find(static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32 | static_cast<uint32_t>(b));
    return it == merges.end() ? nullptr : &it->second;
  }
};

// Parses path (a tokenizer.json or a directory holding one); throws lf::Error naming the file
// and the unsupported or malformed field.
std::shared_ptr<const BpeModel> load_bpe_model(const std::string& path);

// GPT-2's byte -> printable character mapping used by ByteLevel (as UTF-8 strings).
const std::array<std::string, 256>& byte_to_unicode();

}  // namespace lf::data::detail
