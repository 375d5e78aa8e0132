// ByteTokenizer and the --tokenizer-type factory.
#include "loongforge/data/tokenizer.h"

#include <algorithm>
#include <cctype>

#include "loongforge/core/error.h"
#include "loongforge/data/hf_bpe_tokenizer.h"

namespace lf::data {

void ByteTokenizer::encode_into(std::string_view text, std::vector<int32_t>& out) {
  out.reserve(out.size() + text.size());
  for (unsigned char c : text) out.push_back(c);
}

void ByteTokenizer::encode_with_offsets(std::string_view text, std::vector<int32_t>& out,
                                        std::vector<ByteSpan>& spans) {
  encode_into(text, out);
  for (size_t k = 0; k < text.size(); ++k) spans.push_back({k, k + 1});
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string s;
  s.reserve(ids.size());
  for (int32_t id : ids) {
    LF_CHECK(id >= 0 && id <= kEod, "ByteTokenizer: id ", id, " is outside [0, 256]");
    if (id == kEod) s += "<|endoftext|>";
    else s += static_cast<char>(id);
  }
  return s;
}

std::unique_ptr<Tokenizer> make_tokenizer(std::string_view type, const std::string& model) {
  std::string t(type);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "byte" || t == "bytetokenizer") return std::make_unique<ByteTokenizer>();
  if (t == "hf" || t == "huggingfacetokenizer") {
    LF_CHECK(!model.empty(), "--tokenizer-type ", type, " needs --tokenizer-model",
             lf::hint("a tokenizer.json or the directory holding it"));
    return std::make_unique<HfBpeTokenizer>(model);
  }
  LF_FAIL("unknown --tokenizer-type \"", type, "\"",
          lf::hint("known types: HuggingFaceTokenizer (hf), ByteTokenizer (byte)"));
}

}  // namespace lf::data
