// loongforge-data render-chat: conversations jsonl -> {"input_ids", "assistant_masks"} jsonl, as
// transformers' apply_chat_template(..., tokenize=True, return_dict=True,
// return_assistant_tokens_mask=True) returns them.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "loongforge/core/error.h"
#include "loongforge/data/chat_template.h"
#include "loongforge/data/hf_bpe_tokenizer.h"

namespace lf::data::tools {

ChatTemplate load_chat_template(const std::string& dir, const std::string& name, const std::string& kwargs) {
  LF_CHECK(!dir.empty(), "--tokenizer-model is required: the HF tokenizer directory holding the chat template");
  ChatTemplate tpl = ChatTemplate::from_tokenizer_dir(dir, name);
  if (!kwargs.empty()) tpl.set_template_kwargs(kwargs);
  return tpl;
}

int run_render_chat(const RenderChatOptions& o) {
  ChatTemplate tpl = load_chat_template(o.tokenizer_model, o.chat_template_name, o.chat_template_kwargs);
  HfBpeTokenizer tok(o.tokenizer_model);
  std::ifstream in(o.input, std::ios::binary);
  LF_CHECK(in.good(), "cannot open input ", o.input);
  std::ofstream out(o.output, std::ios::binary);
  LF_CHECK(out.good(), "cannot write ", o.output);
  int64_t line_no = 0, written = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;  // blank line
    ChatTokens t;
    try {
      t = tpl.tokenize(line, o.add_generation_prompt, tok);
    } catch (const lf::Error& e) {
      LF_FAIL(o.input, ":", line_no, ": ", e.message(), lf::hint(e.hint()));
    }
    nlohmann::json j = {{"input_ids", t.input_ids}, {"assistant_masks", t.assistant_masks}};
    out << j.dump() << "\n";
    ++written;
  }
  out.close();
  LF_CHECK(out.good(), "writing ", o.output, " failed");
  std::printf("%s: %lld conversations -> %s (%s)\n", o.input.c_str(), static_cast<long long>(written),
              o.output.c_str(), tpl.describe().c_str());
  return 0;
}

}  // namespace lf::data::tools
