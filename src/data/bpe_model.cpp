// tokenizer.json loading for byte-level BPE and SentencePiece-style BPE (byte fallback).
#include "bpe_model.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "unicode.h"

namespace lf::data::detail {
namespace {

using nlohmann::json;

// GPT-2's pre-tokenizer pattern (ByteLevel with use_regex).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string type_of(const json& j) { return j.is_object() ? j.value("type", "") : ""; }

void add_normalizer(BpeModel& m, const json& j, const std::string& where) {
  if (j.is_null()) return;
  std::string t = type_of(j);
  if (t == "Sequence") {
    for (const auto& n : j.at("normalizers")) add_normalizer(m, n, where);
  } else if (t == "NFC") {
    m.norm.push_back({NormalizeStep::Kind::nfc, "", ""});
  } else if (t == "Replace") {
    const json& pat = j.at("pattern");
    LF_CHECK(pat.contains("String"), where, ": normalizer Replace with a regex pattern is not supported (a String "
             "pattern is)");
    NormalizeStep s{NormalizeStep::Kind::replace, pat.at("String").get<std::string>(), j.at("content").get<std::string>()};
    LF_CHECK(!s.pattern.empty(), where, ": normalizer Replace has an empty pattern");
    m.norm.push_back(std::move(s));
  } else if (t == "Prepend") {
    m.norm.push_back({NormalizeStep::Kind::prepend, "", j.at("prepend").get<std::string>()});
  } else {
    LF_FAIL(where, ": normalizer \"", t, "\" is not supported (null, NFC, Replace and Prepend are)",
            lf::hint("byte-level BPE tokenizers (LLaMA-3, Qwen, GPT-2) use null or NFC; SentencePiece-style ones "
                     "(Gemma, LLaMA-2) Replace and Prepend"));
  }
}

bool has_byte_level(const json& j) {
  if (!j.is_object()) return false;
  if (type_of(j) == "ByteLevel") return true;
  for (const char* list : {"pretokenizers", "decoders"})
    if (j.contains(list))
      for (const auto& p : j.at(list))
        if (has_byte_level(p)) return true;
  return false;
}

// A SentencePiece-style decoder: Sequence of Replace("▁" -> " "), ByteFallback, Fuse, Strip.
void add_spm_decoder(BpeModel& m, const json& j, const std::string& where, std::string& space_marker,
                     bool& byte_tokens, bool& fused) {
  if (j.is_null()) return;
  const std::string t = type_of(j);
  if (t == "Sequence") {
    for (const auto& d : j.at("decoders")) add_spm_decoder(m, d, where, space_marker, byte_tokens, fused);
  } else if (t == "Replace") {
    const json& pat = j.at("pattern");
    LF_CHECK(pat.contains("String") && j.at("content") == " ", where, ": decoder Replace ", j.dump(),
             " is not supported (a String pattern -> \" \" is)");
    space_marker = pat.at("String").get<std::string>();
  } else if (t == "Strip") {
    LF_CHECK(j.value("content", " ") == " " && j.value("stop", 0) == 0, where, ": decoder Strip ", j.dump(),
             " is not supported (content \" \", stop 0 is)");
    m.strip_start = j.value("start", 0);
    m.strip_each_token = !fused;
  } else if (t == "ByteFallback") {
    byte_tokens = true;
  } else if (t == "Fuse") {
    fused = true;
  } else {
    LF_FAIL(where, ": decoder \"", t, "\" is not supported with a SentencePiece-style BPE (Sequence, Replace, "
            "ByteFallback, Fuse, Strip are)");
  }
}

// TemplateProcessing's single template (Sequence / ByteLevel / RobertaProcessing-free files).
void add_post_processor(BpeModel& m, const json& j, const std::string& where) {
  if (j.is_null()) return;
  const std::string t = type_of(j);
  if (t == "Sequence") {
    for (const auto& p : j.at("processors")) add_post_processor(m, p, where);
  } else if (t == "TemplateProcessing") {
    bool seen_text = false;
    for (const auto& piece : j.at("single")) {
      if (piece.contains("Sequence")) {
        LF_CHECK(!seen_text, where, ": post_processor TemplateProcessing names the text twice");
        seen_text = true;
        continue;
      }
      const std::string name = piece.at("SpecialToken").at("id").get<std::string>();
      LF_CHECK(j.at("special_tokens").contains(name), where, ": post_processor TemplateProcessing uses '", name,
               "', which its special_tokens do not define");
      for (const auto& id : j.at("special_tokens").at(name).at("ids"))
        (seen_text ? m.template_suffix : m.template_prefix).push_back(id.get<int32_t>());
    }
    LF_CHECK(seen_text, where, ": post_processor TemplateProcessing has no $A");
  } else if (t != "ByteLevel") {
    m.template_error = where + ": post_processor \"" + t + "\" is not supported (TemplateProcessing is)";
  }
}

void add_pre_tokenizer(BpeModel& m, const json& j, const std::string& where) {
  if (j.is_null()) return;
  std::string t = type_of(j);
  if (t == "Sequence") {
    for (const auto& p : j.at("pretokenizers")) add_pre_tokenizer(m, p, where);
  } else if (t == "Split") {
    const json& pat = j.at("pattern");
    std::string behavior = j.value("behavior", "Isolated");
    LF_CHECK(behavior == "Isolated" || behavior == "MergedWithPrevious", where, ": Split behavior \"", behavior,
             "\" is not supported (Isolated and MergedWithPrevious are)");
    LF_CHECK(!j.value("invert", false), where, ": Split with invert=true is not supported");
    PreTokenizerStep s;
    s.merged_with_previous = behavior == "MergedWithPrevious";
    if (pat.contains("Regex"))
      s.regex = std::make_shared<CompiledRegex>(pat.at("Regex").get<std::string>(), false, where);
    else
      s.regex = std::make_shared<CompiledRegex>(pat.at("String").get<std::string>(), true, where);
    m.steps.push_back(std::move(s));
  } else if (t == "ByteLevel") {
    PreTokenizerStep s;
    s.kind = PreTokenizerStep::Kind::byte_level;
    s.add_prefix_space = j.value("add_prefix_space", false);
    if (j.value("use_regex", true))
      s.regex = std::make_shared<CompiledRegex>(kGpt2Pattern, false, where);
    m.steps.push_back(std::move(s));
  } else {
    LF_FAIL(where, ": pre_tokenizer \"", t, "\" is not supported (Sequence, Split, ByteLevel are)",
            lf::hint("byte-level BPE (ByteLevel) and SentencePiece-style BPE (no pre-tokenizer, or Split) are supported"));
  }
}

std::string find_tokenizer_json(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::is_directory(path)) {
    auto p = fs::path(path) / "tokenizer.json";
    LF_CHECK(fs::exists(p), path, " is a directory without tokenizer.json",
             lf::hint("--tokenizer-model takes a tokenizer.json or the directory holding it"));
    return p.string();
  }
  LF_CHECK(fs::exists(path), "tokenizer file ", path, " does not exist");
  return path;
}

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LF_CHECK(in.good(), "cannot open ", path);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    LF_FAIL(path, ": not valid JSON: ", e.what());
  }
}

// tokenizer_config.json beside tokenizer.json, or null when there is none.
json read_tokenizer_config(const std::string& tokenizer_json) {
  const auto path = std::filesystem::path(tokenizer_json).parent_path() / "tokenizer_config.json";
  return std::filesystem::exists(path) ? read_json(path.string()) : json();
}

// transformers 5 registers tokenizer_config.json's special tokens as special added tokens: bos,
// eos, unk, sep, pad, cls and mask; other keys ending in "_token" (boi_token, ...; here in key
// order, transformers takes the file's); extra_special_tokens given as {name: token}; then
// extra_special_tokens given as a list (or, without it, additional_special_tokens). One that tokenizer.json lists already is marked special; one in
// the vocabulary keeps its id (and is no longer split by BPE); a new one gets the next id as
// tokenizers' AddedVocabulary assigns it (the vocabulary's size, or one past the largest added id).
// An object form's lstrip / rstrip / single_word / normalized are kept.
void add_config_special_tokens(BpeModel& m, const json& c, int32_t& max_id) {
  if (!c.is_object()) return;
  std::vector<json> tokens;
  auto take = [&](const json& v) {
    if (v.is_string() || (v.is_object() && v.contains("content") && v["content"].is_string())) tokens.push_back(v);
  };
  static const std::vector<std::string> named = {"bos_token", "eos_token", "unk_token", "sep_token",
                                                 "pad_token", "cls_token", "mask_token"};
  for (const auto& key : named)
    if (c.contains(key)) take(c[key]);
  const json extra = c.contains("extra_special_tokens") ? c["extra_special_tokens"]
                     : c.contains("additional_special_tokens") ? c["additional_special_tokens"] : json();
  for (const auto& [k, v] : c.items())
    if (k.size() > 6 && k.compare(k.size() - 6, 6, "_token") == 0 &&
        std::find(named.begin(), named.end(), k) == named.end() && k != "extra_special_tokens")
      take(v);
  if (extra.is_object())
    for (const auto& [k, v] : extra.items()) take(v);
  if (extra.is_array())
    for (const auto& v : extra) take(v);
  const auto model_size = static_cast<int32_t>(m.vocab.size());
  for (const auto& v : tokens) {
    const std::string name = v.is_string() ? v.get<std::string>() : v["content"].get<std::string>();
    if (name.empty()) continue;
    auto known = std::find_if(m.added.begin(), m.added.end(), [&](const AddedToken& t) { return t.content == name; });
    if (known != m.added.end()) {
      known->special = true;
      continue;
    }
    int32_t id;
    if (auto it = m.vocab.find(name); it != m.vocab.end()) {
      id = it->second;
    } else {
      int32_t max_added = -1;
      for (const auto& t : m.added) max_added = std::max(max_added, t.id);
      id = max_added < 0 ? model_size : (max_added >= model_size || model_size == 0) ? max_added + 1 : model_size;
    }
    auto flag = [&](const char* key) { return v.is_object() && v.value(key, false); };
    m.added.push_back(AddedToken{name, id, true, flag("lstrip"), flag("rstrip"), flag("single_word"), flag("normalized")});
    max_id = std::max(max_id, id);
  }
}

}  // namespace

const std::array<std::string, 256>& byte_to_unicode() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      unicode::append_utf8(t[b], printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++));
    }
    return t;
  }();
  return table;
}

std::shared_ptr<const BpeModel> load_bpe_model(const std::string& given) {
  auto m = std::make_shared<BpeModel>();
  m->path = find_tokenizer_json(given);
  const std::string& where = m->path;
  json j = read_json(where);
  const json config = read_tokenizer_config(where);
  try {
    const json& model = j.at("model");
    LF_CHECK(type_of(model) == "BPE" || (!model.contains("type") && model.contains("merges")),
             where, ": model type \"", type_of(model), "\" is not supported (BPE is)");
    m->byte_fallback = model.value("byte_fallback", false);
    m->spm = m->byte_fallback || !(has_byte_level(j.value("pre_tokenizer", json())) ||
                                   has_byte_level(j.value("decoder", json())));
    m->fuse_unk = model.value("fuse_unk", false);
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      LF_CHECK(!model.contains(k) || model[k].is_null() || model[k] == "", where, ": model.", k,
               " = ", model[k].dump(), " is not supported");
    LF_CHECK(!model.contains("dropout") || model["dropout"].is_null() || model["dropout"] == 0.0,
             where, ": BPE dropout is not supported for encoding");
    m->ignore_merges = model.value("ignore_merges", false);

    // Reverse byte-level map: printable char -> byte.
    std::unordered_map<std::string, unsigned char> char_byte;
    for (int b = 0; b < 256; ++b) char_byte[byte_to_unicode()[b]] = static_cast<unsigned char>(b);
    // What decode emits for a SentencePiece-style token: "<0xXX>" is its byte (ByteFallback),
    // the decoder's space marker (▁) a space.
    std::string space_marker;
    bool byte_tokens = false, fused = false;
    if (m->spm) add_spm_decoder(*m, j.value("decoder", json()), where, space_marker, byte_tokens, fused);
    auto is_byte_token = [&](const std::string& tok) {
      return byte_tokens && tok.size() == 6 && tok.rfind("<0x", 0) == 0 && tok[5] == '>' &&
             std::isxdigit(static_cast<unsigned char>(tok[3])) && std::isxdigit(static_cast<unsigned char>(tok[4]));
    };
    auto spm_text = [&](const std::string& tok) {
      if (is_byte_token(tok)) return std::string(1, static_cast<char>(std::stoi(tok.substr(3, 2), nullptr, 16)));
      if (space_marker.empty()) return tok;
      std::string out;
      for (size_t i = 0; i < tok.size();) {
        if (tok.compare(i, space_marker.size(), space_marker) == 0) {
          out += ' ', i += space_marker.size();
        } else {
          out += tok[i++];
        }
      }
      return out;
    };
    auto to_raw = [&](const std::string& tok, std::string& raw) {
      if (m->spm) {  // plain UTF-8 tokens
        raw = tok;
        return true;
      }
      raw.clear();
      for (size_t i = 0; i < tok.size();) {
        size_t s = i;
        uint32_t cp;
        if (!unicode::decode_utf8(tok, i, cp)) return false;
        auto it = char_byte.find(tok.substr(s, i - s));
        if (it == char_byte.end()) return false;
        raw += static_cast<char>(it->second);
      }
      return true;
    };

    int32_t max_id = -1;
    for (const auto& [tok, idv] : model.at("vocab").items()) {
      int32_t id = idv.get<int32_t>();
      LF_CHECK(id >= 0, where, ": vocab id ", id, " of token ", tok, " is negative");
      m->vocab.emplace(tok, id);
      max_id = std::max(max_id, id);
    }
    for (const auto& a : j.value("added_tokens", json::array())) {
      AddedToken t{a.at("content").get<std::string>(), a.at("id").get<int32_t>(), a.value("special", false),
                   a.value("lstrip", false), a.value("rstrip", false), a.value("single_word", false),
                   a.value("normalized", false)};
      LF_CHECK(!t.content.empty(), where, ": added token ", t.id, " is empty");
      max_id = std::max(max_id, t.id);
      m->added.push_back(std::move(t));
    }
    add_config_special_tokens(*m, config, max_id);
    m->vocab_size = max_id + 1;
    m->id_bytes.assign(static_cast<size_t>(m->vocab_size), std::string());
    m->id_token.assign(static_cast<size_t>(m->vocab_size), std::string());
    m->id_is_byte.assign(static_cast<size_t>(m->vocab_size), 0);
    std::string raw;
    for (const auto& [tok, id] : m->vocab) {
      m->id_token[id] = tok;
      m->id_is_byte[id] = m->spm && is_byte_token(tok);
      // ByteLevel decoder: a token all of whose chars map back to bytes becomes those bytes,
      // any other token is emitted as its own UTF-8.
      m->id_bytes[id] = m->spm ? spm_text(tok) : to_raw(tok, raw) ? raw : tok;
      if (to_raw(tok, raw)) m->raw_vocab.emplace(raw, id);
    }
    for (const auto& t : m->added) {
      m->id_token[t.id] = t.content;
      m->id_bytes[t.id] = m->spm ? spm_text(t.content) : to_raw(t.content, raw) ? raw : t.content;  // HF decodes added tokens too
      m->id_is_byte[t.id] = m->spm && is_byte_token(t.content);
    }
    for (int b = 0; b < 256; ++b) {
      auto it = m->vocab.find(byte_to_unicode()[b]);
      m->byte_id[b] = it == m->vocab.end() || m->spm ? -1 : it->second;
      char hex[8];
      std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
      auto fb = m->vocab.find(std::string(hex));
      m->fallback_id[b] = fb == m->vocab.end() ? -1 : fb->second;
    }
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      const std::string u = model["unk_token"].get<std::string>();
      auto it = m->vocab.find(u);
      LF_CHECK(it != m->vocab.end(), where, ": model.unk_token '", u, "' is not in the vocab");
      m->unk = it->second;
    }

    const json& merges = model.at("merges");
    m->merges.reserve(merges.size() * 2);
    int32_t rank = 0;
    for (const auto& mj : merges) {
      std::string a, b;
      if (mj.is_string()) {  // "a b" (tokenizers < 0.20)
        const std::string& s = mj.get_ref<const std::string&>();
        size_t sp = s.find(' ');
        LF_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < s.size() &&
                     s.find(' ', sp + 1) == std::string::npos,
                 where, ": merge ", rank, " \"", s, "\" is not two tokens separated by one space");
        a = s.substr(0, sp), b = s.substr(sp + 1);
      } else {  // ["a", "b"]
        LF_CHECK(mj.is_array() && mj.size() == 2, where, ": merge ", rank, " ", mj.dump(),
                 " is neither \"a b\" nor [\"a\", \"b\"]");
        a = mj[0].get<std::string>(), b = mj[1].get<std::string>();
      }
      auto ia = m->vocab.find(a), ib = m->vocab.find(b), iab = m->vocab.find(a + b);
      LF_CHECK(ia != m->vocab.end() && ib != m->vocab.end() && iab != m->vocab.end(), where,
               ": merge ", rank, " (", a, ", ", b, ") uses a token missing from the vocab");
      m->merges[static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32 |
                static_cast<uint32_t>(ib->second)] = Merge{rank, iab->second};
      ++rank;
    }

    add_normalizer(*m, j.value("normalizer", json()), where);
    if (std::all_of(m->norm.begin(), m->norm.end(), [](const auto& n) { return n.kind == NormalizeStep::Kind::nfc; })) {
      m->nfc = !m->norm.empty();
      m->norm.clear();
    }
    add_pre_tokenizer(*m, j.value("pre_tokenizer", json()), where);
    if (m->spm)
      for (const auto& step : m->steps)
        LF_CHECK(step.kind != PreTokenizerStep::Kind::byte_level, where,
                 ": a ByteLevel pre-tokenizer with byte_fallback is not supported");
    std::string dec = type_of(j.value("decoder", json()));
    if (!m->spm && !dec.empty() && dec != "ByteLevel")
      LF_WARN(where, ": decoder \"", dec, "\" is decoded as ByteLevel");
    add_post_processor(*m, j.value("post_processor", json()), where);
  } catch (const json::exception& e) {
    LF_FAIL(where, ": malformed tokenizer.json: ", e.what());
  }

  m->trie.emplace_back();
  for (size_t k = 0; k < m->added.size(); ++k) {
    int32_t node = 0;
    for (unsigned char c : m->added[k].content) {
      auto& next = m->trie[static_cast<size_t>(node)].next;
      auto it = std::find_if(next.begin(), next.end(), [c](const auto& e) { return e.first == c; });
      if (it != next.end()) {
        node = it->second;
      } else {
        int32_t fresh = static_cast<int32_t>(m->trie.size());
        next.emplace_back(c, fresh);  // may reallocate trie below: take the index first
        m->trie.emplace_back();
        node = fresh;
      }
    }
    m->trie[static_cast<size_t>(node)].token = static_cast<int32_t>(k);
    m->added_first_byte[static_cast<unsigned char>(m->added[k].content[0])] = true;
  }

  // End of document: tokenizer_config.json's eos_token, else a well-known name.
  auto lookup = [&](const std::string& s) -> std::optional<int32_t> {
    for (const auto& t : m->added)
      if (t.content == s) return t.id;
    auto it = m->vocab.find(s);
    if (it != m->vocab.end()) return it->second;
    return std::nullopt;
  };
  if (config.is_object() && config.contains("eos_token")) {
    const json& e = config["eos_token"];
    std::string s = e.is_string() ? e.get<std::string>() : e.is_object() ? e.value("content", "") : "";
    if (!s.empty()) m->eod = lookup(s);
  }
  for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"})
    if (!m->eod) m->eod = lookup(name);
  return m;
}

}  // namespace lf::data::detail
