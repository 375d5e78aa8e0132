// Chat templates rendered as transformers' apply_chat_template renders them: the template of a
// tokenizer directory, the variables transformers passes, {% generation %} spans, and the
// tokens with their assistant masks. Not a Jinja API (the engine is internal to the data layer,
// docs/data.md lists its subset) and not a batcher: sft_dataset.h reads preprocessed results.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loongforge/data/tokenizer.h"

namespace lf::data {

struct ChatRender {
  std::string text;
  // Byte spans [begin, end) of the template's {% generation %} blocks, as transformers records
  // them (character offsets there; the same spans in bytes here).
  std::vector<std::pair<size_t, size_t>> generation;
};

struct ChatTokens {
  std::vector<int32_t> input_ids;
  std::vector<uint8_t> assistant_masks;  // 1: an answer token
};

class ChatTemplate {
 public:
  // The template of a tokenizer directory as transformers 5 loads it: chat_template.jinja (and
  // additional_chat_templates/*.jinja, by file name) if present, else "chat_template" in
  // tokenizer_config.json (a string, or a list of {"name", "template"}). `name` picks a named
  // template; empty: the only one, else "default" ("tool_use" when the conversation has tools).
  // Special tokens (bos_token, eos_token, unk_token, sep_token, pad_token, cls_token,
  // mask_token) come from tokenizer_config.json, as strings or {"content": ...} objects.
  static ChatTemplate from_tokenizer_dir(const std::string& dir, const std::string& name = "");
  // One template source; special_tokens_json: a JSON object of template variables such as
  // {"bos_token": "<s>"} ("{}" for none). `origin` names the template in errors.
  ChatTemplate(std::string source, std::string origin, std::string_view special_tokens_json = "{}");
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Extra template variables as a JSON object (transformers' **kwargs, e.g.
  // {"enable_thinking": false}); they override the special tokens.
  void set_template_kwargs(std::string_view json_object);
  // Whether the template holds {% generation %} (transformers' test for assistant masks).
  bool has_generation_markers(bool with_tools = false) const;
  std::string describe() const;

  // conversation_json: {"messages": [...], "tools": [...]} (tools optional) as JSON text.
  // Messages are normalized as transformers does (None-valued keys dropped, reasoning fields
  // aliased). Throws lf::Error naming the template position or the malformed field.
  ChatRender render(std::string_view conversation_json, bool add_generation_prompt) const;

  // The tokens of the rendered text (no BOS/EOS added) and the assistant mask: with generation
  // markers, exactly transformers' return_assistant_tokens_mask; without, the spans of each
  // assistant message found by rendering prefixes of the conversation (docs/data.md, "Assistant
  // masks"). A token is masked when it overlaps a span.
  ChatTokens tokenize(std::string_view conversation_json, bool add_generation_prompt,
                      Tokenizer& tokenizer) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lf::data
