#include "loongforge/data/text_table.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>

#include <cctype>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "loongforge/core/error.h"
#include "loongforge/core/safetensors.h"

namespace lf::data {

TextTable TextTable::random(std::vector<std::string> words, int64_t dim, int64_t max_length, uint64_t seed) {
  LF_CHECK(!words.empty() && dim > 0 && max_length > 0, "text table: words, a positive dim and max_length needed");
  TextTable t;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  t.embeddings_ = at::normal(0.0, 1.0, {static_cast<int64_t>(words.size()), dim}, gen, at::kFloat);
  t.words_ = std::move(words);
  t.max_length_ = max_length;
  t.source_ = "a random text table";
  return t;
}

TextTable TextTable::read(const std::string& path) {
  auto r = lf::safetensors::Reader::open(path);
  const auto* info = r.find("embeddings");
  LF_CHECK(info && info->dtype == lf::safetensors::DType::F32 && info->shape.size() == 2, path,
           ": a text table holds tensor 'embeddings' [words, dim] in F32",
           lf::hint("write it with loongforge-data diffusion (--text-table)"));
  TextTable t;
  t.source_ = path;
  t.embeddings_ = at::empty(info->shape, at::kFloat);
  std::memcpy(t.embeddings_.data_ptr(), r.data(*info), static_cast<size_t>(info->end - info->begin));
  const auto& meta = r.metadata();
  auto words = meta.find("words"), len = meta.find("max_length");
  LF_CHECK(words != meta.end() && len != meta.end(), path, ": a text table needs metadata 'words' and 'max_length'");
  try {
    t.words_ = nlohmann::json::parse(words->second).get<std::vector<std::string>>();
    t.max_length_ = std::stoll(len->second);
  } catch (const std::exception& e) {
    LF_FAIL(path, ": malformed text table metadata: ", e.what());
  }
  LF_CHECK(static_cast<int64_t>(t.words_.size()) == info->shape[0] && t.max_length_ > 0, path, ": ", t.words_.size(),
           " words for ", info->shape[0], " rows (max_length ", t.max_length_, ")");
  return t;
}

void TextTable::write(const std::string& path) const {
  lf::safetensors::Writer w;
  at::Tensor e = embeddings_.contiguous();
  w.add("embeddings", lf::safetensors::DType::F32, e.sizes().vec(), e.data_ptr());
  w.set_metadata("words", nlohmann::json(words_).dump());
  w.set_metadata("max_length", std::to_string(max_length_));
  w.write(path);
}

int64_t TextTable::dim() const { return embeddings_.size(1); }

std::vector<std::string> TextTable::words_of(const std::string& caption) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : caption) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || c == '-' || c == '_') {
      cur.push_back(static_cast<char>(std::tolower(c)));
    } else if (!cur.empty()) {
      out.push_back(cur);
      cur.clear();
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

at::Tensor TextTable::encode(const std::string& caption) const {
  const auto words = words_of(caption);
  LF_CHECK(static_cast<int64_t>(words.size()) <= max_length_, "the caption '", caption, "' has ", words.size(),
           " words; the text table (", source_, ") encodes at most ", max_length_);
  std::map<std::string, int64_t> row;
  for (size_t i = 0; i < words_.size(); ++i) row.emplace(words_[i], static_cast<int64_t>(i));
  at::Tensor out = at::zeros({max_length_, dim()}, at::kFloat);
  for (size_t k = 0; k < words.size(); ++k) {
    auto it = row.find(words[k]);
    if (it == row.end()) {
      std::string known;
      for (const auto& w : words_) known += (known.empty() ? "" : ", ") + w;
      LF_FAIL("the word '", words[k], "' of the caption '", caption, "' is not in the text table (", source_, ")",
              lf::hint("its words: " + known));
    }
    out[static_cast<int64_t>(k)].copy_(embeddings_[it->second]);
  }
  return out;
}

}  // namespace lf::data
