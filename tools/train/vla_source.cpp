// loongforge-train's data source for VLA policies (DataNeeds::vla): a reach demo store
// (vla/reach_demo.h, loongforge-data make-demo-reach), one sample per row: the camera image as the
// policy's one camera in [-1, 1], the prompt, the state it carries (decoded from its bins), and the
// expert's action chunk zero-padded to the model's max_action_dim. Or, for a pi05 policy, a LeRobot
// dataset (vla/lerobot_inputs.h): one sample per frame, as LeRobot's pi05 preprocessor makes it.
#include <ATen/Functions.h>


#include "data_source_internal.h"
#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/models/registry.h"
#include "loongforge/vla/lerobot_inputs.h"
#include "loongforge/vla/reach_demo.h"

namespace lf::tools {
namespace {

// A LeRobot dataset (v3.0 or v2.1) for a pi05 policy: every frame a sample, as LeRobot's pi05
// preprocessor makes it (vla/lerobot_inputs.h).
DataSources make_lerobot_sources(const lf::config::JobConfig& job, const lf::models::DataNeeds& needs,
                                 const lf::dist::ParallelContext& ctx, int64_t train_samples, int64_t valid_samples) {
  const auto& d = job.data;
  const std::string dir = d.data_path[0];
  LF_CHECK(needs.policy == "pi05", dir, " is a LeRobot dataset; loongforge-train reads LeRobot datasets for pi05 "
           "policies (a ", needs.policy, " policy needs its own processor, not built yet)",
           lf::hint("train the " + needs.policy + " policy on a reach demo store (loongforge-data make-demo-reach) "
                    "or --mock-data"));
  LF_CHECK(d.tokenizer_model.has_value(), dir, " is a LeRobot dataset: its prompts are tokenised with the "
           "PaliGemma tokenizer, and data.tokenizer_model is not set",
           lf::hint("pass --tokenizer-model DIR (tokenizer.json and tokenizer_config.json, e.g. "
                    "google/paligemma-3b-pt-224's)"));
  LF_CHECK(!d.tokenizer_type || *d.tokenizer_type == "HuggingFaceTokenizer", "data.tokenizer_type ",
           d.tokenizer_type.value_or(""), " cannot tokenise a pi05 prompt",
           lf::hint("drop --tokenizer-type or pass HuggingFaceTokenizer"));
  lf::vla::Pi05LeRobotOptions o;
  o.tokenizer = *d.tokenizer_model;
  o.image_size = needs.image_size;
  o.chunk = needs.chunk;
  o.action_dim = needs.action_dim;
  o.max_action_dim = needs.max_action_dim;
  o.prompt_length = needs.prompt_length;
  o.vocab_size = needs.vocab_size;
  auto inputs = std::make_shared<const lf::vla::Pi05LeRobotInputs>(dir, o);
  const auto [train_end, valid_end] = split_ends(d.split, inputs->size(), dir);
  if (ctx.global_rank() == 0)
    LF_INFO("LeRobot dataset ", dir, " (", inputs->dataset().version(), "): ", inputs->size(), " frames of ",
            inputs->dataset().num_episodes(), " episodes (train ", train_end, ", valid ", valid_end - train_end,
            "), ", inputs->cameras().size(), " cameras resized to ", o.image_size, "x", o.image_size,
            ", prompts of ", o.prompt_length, " tokens, chunks of ", o.chunk);
  auto rows = [inputs](const std::vector<int64_t>& items) { return inputs->batch(items); };
  return make_store_sources(rows, train_end, valid_end, train_samples, valid_samples, job, ctx,
                            "the LeRobot dataset " + dir);
}

// " with position and scene queries (...)": what a reach store's prompts ask the prefix LM.
std::string queries_note(const lf::vla::ReachPrompt& p) {
  if (!p.has_queries()) return "";
  std::vector<std::string> kinds;
  if (p.position_queries) kinds.push_back("position");
  if (p.scene_queries) kinds.push_back("scene");
  if (p.located) kinds.push_back("located");
  std::string out = " with ";
  for (size_t i = 0; i < kinds.size(); ++i) out += (i == 0 ? "" : i + 1 == kinds.size() ? " and " : ", ") + kinds[i];
  out += " queries (prompt_labels: pi05 trains on them when model.prefix_lm_loss_weight > 0)";
  if (p.located) out += " and located answers after them (prompt_ar_mask)";
  return out;
}

}  // namespace

DataSources make_vla_sources(const lf::config::JobConfig& job, const lf::models::DataNeeds& needs,
                             const lf::dist::ParallelContext& ctx, int64_t train_samples, int64_t valid_samples) {
  const auto& d = job.data;
  LF_CHECK(d.data_path.size() == 1, "a VLA policy reads one sample store, data.data_path has ", d.data_path.size(),
           " entries", lf::hint("pass --data-path DIR (made by loongforge-data make-demo-reach)"));
  const std::string dir = d.data_path[0];
  if (lf::data::LeRobotDataset::is_dataset(dir))
    return make_lerobot_sources(job, needs, ctx, train_samples, valid_samples);
  auto store = std::make_shared<const lf::vla::ReachDemoStore>(dir);
  const auto& m = store->meta();
  LF_CHECK(m.image_size == needs.image_size, "reach demo store ", dir, " holds ", m.image_size, "x", m.image_size,
           " images; the model's vision encoder takes ", needs.image_size, "x", needs.image_size,
           lf::hint("set " + needs.image_size_key + " " + std::to_string(m.image_size) +
                    " or remake the store with --image-size " + std::to_string(needs.image_size)));
  LF_CHECK(m.chunk == needs.chunk, "reach demo store ", dir, " holds action chunks of ", m.chunk,
           "; the model predicts ", needs.chunk,
           lf::hint("set " + needs.chunk_key + " " + std::to_string(m.chunk) + " or remake the store with --chunk " +
                    std::to_string(needs.chunk)));
  LF_CHECK(m.action_dim == needs.action_dim, "reach demo store ", dir, " holds ", m.action_dim,
           "-dim actions; the model's action_dim is ", needs.action_dim,
           lf::hint("set model.action_dim " + std::to_string(m.action_dim)));
  LF_CHECK(m.prompt.vocab_size() <= needs.vocab_size, "reach demo store ", dir, ": its prompt vocabulary has ",
           m.prompt.vocab_size(), " tokens, more than the model's vocab_size ", needs.vocab_size,
           lf::hint("set model.foundation.vocab_size >= " + std::to_string(m.prompt.vocab_size())));
  const auto [train_end, valid_end] = split_ends(d.split, store->size(), dir);
  if (ctx.global_rank() == 0)
    LF_INFO("reach demo store ", dir, ": ", store->size(), " samples of ", m.episodes, " episodes (train ",
            train_end, ", valid ", valid_end - train_end, "), ", m.image_size, "x", m.image_size,
            " images, chunks of ", m.chunk, ", prompts of ", m.prompt.length, " tokens",
            queries_note(m.prompt));
  const int64_t max_action_dim = needs.max_action_dim;
  auto rows = [store, max_action_dim](const std::vector<int64_t>& items) {
    std::vector<at::Tensor> images, tokens, masks, actions, states, labels, ar_masks;
    for (int64_t item : items) {
      const auto s = store->get(item);
      images.push_back((s.image.to(at::kFloat) / 127.5 - 1.0).unsqueeze(0));  // [1 camera, 3, S, S]
      tokens.push_back(s.tokens);
      states.push_back(store->meta().prompt.decode_state(s.tokens).unsqueeze(0));  // [1, dims]
      masks.push_back(s.mask);
      if (s.labels.defined()) labels.push_back(s.labels);
      if (s.ar_mask.defined()) ar_masks.push_back(s.ar_mask);
      auto a = at::zeros({s.actions.size(0), max_action_dim}, at::kFloat);
      a.narrow(1, 0, s.actions.size(1)).copy_(s.actions);
      actions.push_back(a);
    }
    lf::data::Batch batch;
    batch.set("images", at::stack(images));
    batch.set("image_masks", at::ones({static_cast<int64_t>(items.size()), 1}, at::kBool));
    batch.set("prompt_tokens", at::stack(tokens));
    batch.set("prompt_masks", at::stack(masks));
    batch.set("actions", at::stack(actions));
    if (!labels.empty()) batch.set("prompt_labels", at::stack(labels));  // the position queries' (pi05's prefix LM loss)
    if (!ar_masks.empty()) batch.set("prompt_ar_mask", at::stack(ar_masks));  // the located answers' block
    batch.set("state", at::stack(states));  // [b, 1, dims]: the prompt's discretised state (groot reads it)
    return batch;
  };
  return make_store_sources(rows, train_end, valid_end, train_samples, valid_samples, job, ctx,
                            "the reach demo store " + dir);
}

}  // namespace lf::tools
