// ChatTemplate: template loading and the variables as transformers 5 does them, generation-span
// masks, and the rendering-based masks for templates without {% generation %}.
#include "loongforge/data/chat_template.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "jinja.h"
#include "loongforge/core/error.h"

namespace lf::data {
namespace {

using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  LF_CHECK(in.good(), "cannot read ", p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ojson parse_json(std::string_view text, const std::string& what) {
  try {
    return ojson::parse(text);
  } catch (const nlohmann::json::exception& e) {
    LF_FAIL(what, " is not valid JSON: ", e.what());
  }
}

// transformers' regex \{\%-?\s*generation\s*-?\%\} on the template text.
bool mentions_generation(const std::string& s) {
  for (size_t k = s.find("{%"); k != std::string::npos; k = s.find("{%", k + 1)) {
    size_t i = k + 2;
    if (i < s.size() && s[i] == '-') ++i;
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    if (s.compare(i, 10, "generation") != 0) continue;
    i += 10;
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    if (i < s.size() && s[i] == '-') ++i;
    if (s.compare(i, 2, "%}") == 0) return true;
  }
  return false;
}

constexpr const char* kSpecialTokenKeys[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                             "pad_token", "cls_token", "mask_token"};

}  // namespace

struct ChatTemplate::Impl {
  struct Entry {
    std::string name;
    jinja::Template tpl;
    bool markers;
  };
  std::vector<Entry> entries;
  bool named = false;      // a dict of templates (transformers' dict chat_template)
  std::string requested;   // the chosen name, or "" for transformers' default choice
  std::string origin;
  ojson special = ojson::object();
  ojson kwargs = ojson::object();

  const Entry& pick(bool has_tools) const {
    if (!named) return entries.front();
    auto find = [&](const std::string& n) -> const Entry* {
      for (const auto& e : entries)
        if (e.name == n) return &e;
      return nullptr;
    };
    std::string names;
    for (const auto& e : entries) names += (names.empty() ? "" : ", ") + e.name;
    if (!requested.empty()) {
      const Entry* e = find(requested);
      LF_CHECK(e, origin, " has no chat template named \"", requested, "\"", lf::hint("its templates: " + names));
      return *e;
    }
    if (has_tools)
      if (const Entry* e = find("tool_use")) return *e;
    const Entry* e = find("default");
    LF_CHECK(e, origin, " has several chat templates and none named \"default\"",
             lf::hint("choose one with --chat-template-name; its templates: " + names));
    return *e;
  }

  struct Conversation {
    ojson messages = ojson::array();
    jinja::Value tools = jinja::None{};
    bool has_tools = false;
  };

  // transformers' _normalize_chat_messages and _alias_reasoning_fields.
  static Conversation parse_conversation(std::string_view text) {
    ojson j = parse_json(text, "the conversation");
    LF_CHECK(j.is_object(), "the conversation is JSON but not an object",
             lf::hint("each conversation is {\"messages\": [{\"role\": ..., \"content\": ...}, ...]}"));
    auto it = j.find("messages");
    LF_CHECK(it != j.end(), "the conversation has no \"messages\"",
             lf::hint("each conversation is {\"messages\": [{\"role\": ..., \"content\": ...}, ...]}"));
    LF_CHECK(it->is_array(), "\"messages\" holds ", it->type_name(), ", not a list of messages");
    LF_CHECK(!it->empty(), "\"messages\" is empty (transformers refuses an empty conversation)");
    Conversation c;
    for (size_t i = 0; i < it->size(); ++i) {
      const ojson& m = (*it)[i];
      LF_CHECK(m.is_object(), "messages[", i, "] holds ", m.type_name(), ", not a message object");
      ojson kept = ojson::object();
      for (auto kv = m.begin(); kv != m.end(); ++kv)
        if (!kv.value().is_null()) kept[kv.key()] = kv.value();
      // {"thinking": r, **message, "reasoning_content": r} with r the first reasoning field set.
      std::optional<ojson> reasoning;
      for (const char* k : {"reasoning_content", "thinking", "reasoning"})
        if (kept.contains(k)) {
          reasoning = kept[k];
          break;
        }
      if (reasoning) {
        ojson aliased = ojson::object();
        aliased["thinking"] = *reasoning;
        for (auto kv = kept.begin(); kv != kept.end(); ++kv) aliased[kv.key()] = kv.value();
        aliased["reasoning_content"] = *reasoning;
        kept = std::move(aliased);
      }
      c.messages.push_back(std::move(kept));
    }
    auto t = j.find("tools");
    if (t != j.end() && !t->is_null()) {
      LF_CHECK(t->is_array(), "\"tools\" holds ", t->type_name(), ", not a list of tool schemas");
      for (size_t k = 0; k < t->size(); ++k)
        LF_CHECK((*t)[k].is_object(), "tools[", k, "] holds ", (*t)[k].type_name(),
                 ", not a JSON schema object");
      c.tools = jinja::from_json(*t);
      c.has_tools = true;
    }
    return c;
  }

  // Renders messages[0, count) of the conversation.
  jinja::RenderResult render(const Entry& e, const Conversation& c, size_t count, bool add_generation_prompt) const {
    jinja::Variables vars;
    ojson msgs = ojson::array();
    for (size_t k = 0; k < count; ++k) msgs.push_back(c.messages[k]);
    vars.emplace_back("messages", jinja::from_json(msgs));
    vars.emplace_back("tools", c.tools);
    vars.emplace_back("documents", jinja::None{});
    vars.emplace_back("add_generation_prompt", add_generation_prompt);
    auto put = [&](const std::string& k, const ojson& v) {
      for (auto& kv : vars)
        if (kv.first == k) {
          kv.second = jinja::from_json(v);
          return;
        }
      vars.emplace_back(k, jinja::from_json(v));
    };
    for (auto kv = special.begin(); kv != special.end(); ++kv) put(kv.key(), kv.value());
    for (auto kv = kwargs.begin(); kv != kwargs.end(); ++kv) put(kv.key(), kv.value());
    return e.tpl.render(vars);
  }

  // Spans of each assistant message for a template without generation markers.
  std::vector<std::pair<size_t, size_t>> rendered_spans(const Entry& e, const Conversation& c,
                                                        const std::string& full, Tokenizer& tok) const {
    std::vector<std::pair<size_t, size_t>> spans;
    std::vector<int32_t> ids;
    std::vector<ByteSpan> offs;
    for (size_t i = 0; i < c.messages.size(); ++i) {
      auto role = c.messages[i].find("role");
      if (role == c.messages[i].end() || *role != "assistant") continue;
      auto render_prefix = [&](size_t count, bool agp) {
        try {
          return render(e, c, count, agp).text;
        } catch (const lf::Error& err) {
          LF_FAIL("assistant mask of messages[", i, "]: rendering messages[:", count, "]",
                  agp ? " with the generation prompt" : "", " failed: ", err.message(),
                  lf::hint("the mask of a template without {% generation %} markers renders the "
                           "conversation up to each assistant message; add generation markers to "
                           "the template if it cannot render such prefixes"));
        }
      };
      std::string prompt = render_prefix(i, true);
      size_t start;
      if (full.compare(0, prompt.size(), prompt) == 0 && prompt.size() <= full.size()) {
        start = prompt.size();
      } else {
        std::string history = render_prefix(i, false);
        LF_CHECK(history.size() <= full.size() && full.compare(0, history.size(), history) == 0,
                 "assistant mask of messages[", i, "]: the template renders messages[:", i,
                 "] differently from the start of the whole conversation, so the message's span "
                 "cannot be found by rendering",
                 lf::hint("add {% generation %} ... {% endgeneration %} around the assistant "
                          "content and end token in the template (transformers' markers)"));
        // The generation prompt and the full render part where the answer begins (e.g. Qwen3
        // with enable_thinking=false prompts an empty <think></think> that history omits).
        start = 0;
        while (start < prompt.size() && start < full.size() && prompt[start] == full[start]) ++start;
        start = std::max(start, history.size());
      }
      std::string upto = render_prefix(i + 1, false);
      std::string tail = upto.size() > start ? upto.substr(start) : std::string();
      ids.clear();
      offs.clear();
      tok.encode_with_offsets(tail, ids, offs);
      std::optional<std::string> end_token;
      size_t end_k = 0;
      for (size_t k = ids.size(); k-- > 0 && !end_token;) {
        end_token = tok.added_token_content(ids[k]);
        end_k = k;
      }
      auto blank = [](std::string_view text) {
        return std::all_of(text.begin(), text.end(), [](char ch) { return ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r'; });
      };
      // Only an added token followed by whitespace and added tokens up to the last one can take its
      // place below; most templates (a turn's content before its end token) need no second render.
      bool earlier_end = false;
      for (size_t k = end_k; end_token && k-- > 0;) {
        if (tok.added_token_content(ids[k])) {
          earlier_end = true;
          break;
        }
        if (!blank(std::string_view(tail).substr(offs[k].begin, offs[k].end - offs[k].begin))) break;
      }
      if (earlier_end) {
        // What a template appends only where a conversation ends without a generation prompt
        // (Phi-3.x's eos_token after the turn's <|end|>\n) is not the turn's: when the renders of
        // messages[:i+1] with and without the prompt part first differ after an added token and
        // whitespace only, and the render without goes on with added tokens and whitespace only,
        // that token ends the turn.
        std::string prompted;  // a template that cannot prompt after this turn: no exception
        try {
          prompted = render(e, c, i + 1, true).text;
        } catch (const lf::Error&) {
          prompted = upto;
        }
        size_t common = 0;
        while (common < upto.size() && common < prompted.size() && upto[common] == prompted[common]) ++common;
        // The difference starts at a token of the tail (renders that part at "<|im_end|>" and
        // "<|assistant|>" share "<|").
        for (const auto& o : offs)
          if (start + o.begin < common && start + o.end > common) common = start + o.begin;
        bool appended_markers = start + offs[end_k].end > common;
        for (size_t k = 0; k < ids.size() && appended_markers; ++k)
          if (start + offs[k].begin >= common && !tok.added_token_content(ids[k]))
            appended_markers = blank(std::string_view(tail).substr(offs[k].begin, offs[k].end - offs[k].begin));
        if (appended_markers)
          for (size_t k = end_k; k-- > 0;) {
            auto added = tok.added_token_content(ids[k]);
            if (!added || start + offs[k].end > common) continue;
            size_t from = start + offs[k].end;
            if (blank(std::string_view(upto).substr(from, common - from))) end_token = added;
            break;
          }
      }
      size_t end;
      if (end_token) {
        size_t at = full.find(*end_token, start);
        LF_CHECK(at != std::string::npos, "assistant mask of messages[", i, "]: its end token ", *end_token,
                 " does not occur in the whole conversation's render after byte ", start,
                 lf::hint("add {% generation %} markers to the template"));
        end = at + end_token->size();
      } else {
        LF_CHECK(upto.size() > start && full.compare(0, upto.size(), upto) == 0, "assistant mask of messages[", i,
                 "]: its render holds no special token to end on and the render of messages[:", i + 1,
                 "] is not a prefix of the whole conversation's",
                 lf::hint("add {% generation %} markers to the template"));
        end = upto.size();
      }
      LF_CHECK(spans.empty() || start >= spans.back().second, "assistant mask of messages[", i,
               "]: its span [", start, ", ", end, ") overlaps the previous assistant message's",
               lf::hint("add {% generation %} markers to the template"));
      spans.emplace_back(start, end);
    }
    return spans;
  }
};

ChatTemplate::ChatTemplate(std::string source, std::string origin, std::string_view special_tokens_json)
    : impl_(std::make_unique<Impl>()) {
  impl_->origin = origin;
  bool markers = mentions_generation(source);
  impl_->entries.push_back({"", jinja::Template(std::move(source), origin), markers});
  impl_->special = parse_json(special_tokens_json, "special tokens of " + origin);
  LF_CHECK(impl_->special.is_object(), "special tokens of ", origin, " must be a JSON object");
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

ChatTemplate ChatTemplate::from_tokenizer_dir(const std::string& dir, const std::string& name) {
  fs::path d(dir);
  LF_CHECK(fs::is_directory(d), "--tokenizer-model ", dir, " is not a directory",
           lf::hint("chat templates are read from an HF tokenizer directory (tokenizer_config.json, chat_template.jinja)"));
  ojson config = ojson::object();
  fs::path config_path = d / "tokenizer_config.json";
  if (fs::exists(config_path)) config = parse_json(read_file(config_path), config_path.string());
  LF_CHECK(config.is_object(), config_path.string(), " is not a JSON object");

  // name -> (source, origin); transformers: template files replace tokenizer_config's.
  std::vector<std::tuple<std::string, std::string, std::string>> found;
  if (fs::exists(d / "chat_template.jinja"))
    found.emplace_back("default", read_file(d / "chat_template.jinja"), (d / "chat_template.jinja").string());
  if (fs::is_directory(d / "additional_chat_templates")) {
    std::vector<fs::path> files;
    for (const auto& f : fs::directory_iterator(d / "additional_chat_templates"))
      if (f.path().extension() == ".jinja") files.push_back(f.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) found.emplace_back(f.stem().string(), read_file(f), f.string());
  }
  bool named = !(found.size() == 1 && std::get<0>(found[0]) == "default");
  if (found.empty()) {
    auto it = config.find("chat_template");
    LF_CHECK(it != config.end() && !it->is_null(), dir, " has no chat template: no chat_template.jinja and no \"chat_template\" in ",
             config_path.string(), lf::hint("use the tokenizer directory of an instruct/chat model"));
    std::string where = config_path.string() + " \"chat_template\"";
    if (it->is_string()) {
      found.emplace_back("default", it->get<std::string>(), where);
      named = false;
    } else {
      LF_CHECK(it->is_array(), where, " holds ", it->type_name(), ", not a template string or a list of {\"name\", \"template\"}");
      for (size_t k = 0; k < it->size(); ++k) {
        const ojson& t = (*it)[k];
        LF_CHECK(t.is_object() && t.contains("name") && t["name"].is_string() && t.contains("template") &&
                     t["template"].is_string(),
                 where, "[", k, "] is not a {\"name\": ..., \"template\": ...} object");
        found.emplace_back(t["name"].get<std::string>(), t["template"].get<std::string>(),
                           where + " \"" + t["name"].get<std::string>() + "\"");
      }
      named = true;
    }
  }
  ojson special = ojson::object();
  for (const char* key : kSpecialTokenKeys) {
    auto it = config.find(key);
    if (it == config.end() || it->is_null()) continue;
    if (it->is_string()) special[key] = *it;
    else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) special[key] = (*it)["content"];
    else LF_FAIL(config_path.string(), " \"", key, "\" holds ", it->type_name(), ", not a token string or {\"content\": ...}");
  }

  ChatTemplate out(std::get<1>(found[0]), std::get<2>(found[0]), special.dump());
  out.impl_->entries.front().name = std::get<0>(found[0]);
  for (size_t k = 1; k < found.size(); ++k) {
    auto& [n, src, origin] = found[k];
    bool markers = mentions_generation(src);
    out.impl_->entries.push_back({n, jinja::Template(src, origin), markers});
  }
  out.impl_->named = named;
  out.impl_->origin = dir;
  if (!name.empty()) {
    LF_CHECK(named, dir, " has a single chat template; --chat-template-name ", name, " names none",
             lf::hint("drop --chat-template-name"));
    out.impl_->requested = name;
    out.impl_->pick(false);  // validates the name now
  }
  return out;
}

void ChatTemplate::set_template_kwargs(std::string_view json_object) {
  ojson j = parse_json(json_object, "--chat-template-kwargs");
  LF_CHECK(j.is_object(), "--chat-template-kwargs must be a JSON object, e.g. '{\"enable_thinking\": false}'");
  for (const char* reserved : {"messages", "tools", "documents", "add_generation_prompt"})
    LF_CHECK(!j.contains(reserved), "--chat-template-kwargs cannot set \"", reserved, "\"",
             lf::hint("conversations carry messages and tools; add_generation_prompt has its own flag"));
  impl_->kwargs = std::move(j);
}

bool ChatTemplate::has_generation_markers(bool with_tools) const { return impl_->pick(with_tools).markers; }

std::string ChatTemplate::describe() const {
  std::string s = "chat template " + impl_->origin;
  if (impl_->named) {
    s += " (templates:";
    for (const auto& e : impl_->entries) s += " " + e.name;
    s += ")";
  }
  s += impl_->entries.front().markers ? ", with generation markers" : ", masks by rendering";
  return s;
}

ChatRender ChatTemplate::render(std::string_view conversation_json, bool add_generation_prompt) const {
  auto c = Impl::parse_conversation(conversation_json);
  const auto& e = impl_->pick(c.has_tools);
  auto r = impl_->render(e, c, c.messages.size(), add_generation_prompt);
  return {std::move(r.text), std::move(r.generation)};
}

ChatTokens ChatTemplate::tokenize(std::string_view conversation_json, bool add_generation_prompt,
                                  Tokenizer& tokenizer) const {
  auto c = Impl::parse_conversation(conversation_json);
  const auto& e = impl_->pick(c.has_tools);
  auto r = impl_->render(e, c, c.messages.size(), add_generation_prompt);
  ChatTokens out;
  std::vector<ByteSpan> offsets;
  tokenizer.encode_with_offsets(r.text, out.input_ids, offsets);
  auto spans = e.markers ? r.generation : impl_->rendered_spans(e, c, r.text, tokenizer);
  // transformers: a token is masked when it overlaps a span; spans are walked in order.
  out.assistant_masks.assign(out.input_ids.size(), 0);
  size_t s = 0;
  for (size_t t = 0; t < offsets.size(); ++t) {
    while (s < spans.size() && offsets[t].begin >= spans[s].second) ++s;
    if (s == spans.size()) break;
    if (offsets[t].end > spans[s].first) out.assistant_masks[t] = 1;
  }
  return out;
}

}  // namespace lf::data
