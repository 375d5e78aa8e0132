#include "vlm_tensors.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "loongforge/core/safetensors.h"
#include "loongforge/dist/parallel_context.h"

namespace lf::tools::generate {
namespace {

// The file's tensors by name (the processor's input_ids / attention_mask / mm_token_type_ids ignored:
// --input-ids gives the ids); another name is an error listing the known ones.
std::map<std::string, at::Tensor> read_inputs(const std::string& file, const std::set<std::string>& known) {
  const auto r = lf::safetensors::Reader::open(file);
  std::map<std::string, at::Tensor> out;
  for (const auto& info : r.tensors()) {
    static const std::set<std::string> ignored{"input_ids", "attention_mask", "mm_token_type_ids"};
    if (ignored.count(info.name)) continue;
    std::string names;
    for (const auto& k : known) names += (names.empty() ? "" : ", ") + k;
    LF_CHECK(known.count(info.name), "--vision-inputs ", file, ": unknown tensor '", info.name, "'", lf::hint(names));
    out[info.name] = tensor_of(r, info);
  }
  return out;
}

}  // namespace

at::Tensor tensor_of(const lf::safetensors::Reader& r, const lf::safetensors::TensorInfo& info) {
  using lf::safetensors::DType;
  static const std::map<DType, at::ScalarType> types{{DType::F32, at::kFloat}, {DType::F16, at::kHalf},
                                                     {DType::BF16, at::kBFloat16}, {DType::F64, at::kDouble},
                                                     {DType::I64, at::kLong}, {DType::I32, at::kInt}};
  auto it = types.find(info.dtype);
  LF_CHECK(it != types.end(), "--vision-inputs ", r.source(), ": tensor ", info.name, " has dtype ",
           lf::safetensors::dtype_name(info.dtype), lf::hint("floats (F32, F16, BF16, F64) or I64 / I32 grids"));
  at::Tensor t = at::empty(info.shape, it->second);
  std::memcpy(t.data_ptr(), r.data(info), info.end - info.begin);
  return t;
}

TensorVlm::TensorVlm(const lf::models::hf::VlmConfig& c, std::map<std::string, at::Tensor>& tensors, bool bf16,
                     const std::string& vision_inputs)
    : config_(c) {
  const auto& be = lf::backend::select_backend();
  const auto dtype = bf16 ? at::kBFloat16 : at::kFloat;
  if (c.intern()) {
    auto m = std::make_unique<lf::models::InternVl>(c.foundation, c.vision_intern, c.own_intern, be, 0, dtype, nullptr,
                                                    false, lf::models::PipelineStage{});
    lf::models::hf::load_full_vlm(*m, tensors);
    model_ = std::move(m);
  } else {
    LF_CHECK(c.qwen3(), "TensorVlm takes qwen3_vl and internvl models, not ", c.type);
    auto m = std::make_unique<lf::models::Qwen3Vl>(c.foundation, c.vision3, c.own3, be, 0, dtype, nullptr, false,
                                                   lf::models::PipelineStage{});
    lf::models::hf::load_full_vlm(*m, tensors);
    model_ = std::move(m);
  }
  tensors.clear();
  model_->set_training(false);
  if (vision_inputs.empty()) return;
  const std::set<std::string> known = c.intern() ? std::set<std::string>{"pixel_values"}
                                                 : std::set<std::string>{"pixel_values", "image_grid_thw",
                                                                         "pixel_values_videos", "video_grid_thw"};
  media_ = read_inputs(vision_inputs, known);
  if (c.qwen3())
    for (const auto& [pix, grid] : {std::pair<std::string, std::string>{"pixel_values", "image_grid_thw"},
                                    {"pixel_values_videos", "video_grid_thw"}})
      LF_CHECK(media_.count(pix) == media_.count(grid), "--vision-inputs ", vision_inputs, ": ",
               media_.count(pix) ? pix : grid, " without ", media_.count(pix) ? grid : pix);
}

TensorVlm::~TensorVlm() = default;

at::Tensor TensorVlm::logits(const std::vector<int64_t>& ids) const {
  at::NoGradGuard no_grad;
  const at::Tensor tokens = at::tensor(ids, at::TensorOptions().dtype(at::kLong)).unsqueeze(0);
  auto field = [&](const char* name, at::ScalarType dtype) {
    auto it = media_.find(name);
    return it == media_.end() ? at::Tensor() : it->second.to(dtype);
  };
  at::Tensor out;
  if (config_.intern())
    out = static_cast<const lf::models::InternVl&>(*model_).logits(tokens, field("pixel_values", at::kFloat));
  else
    out = static_cast<const lf::models::Qwen3Vl&>(*model_).logits(
        tokens, field("pixel_values", at::kFloat), field("image_grid_thw", at::kLong),
        field("pixel_values_videos", at::kFloat), field("video_grid_thw", at::kLong));
  return out.select(1, 0).to(at::kFloat);  // [s, vocab]
}

std::vector<int64_t> TensorVlm::continue_ids(std::vector<int64_t> ids, const lf::models::GenerateOptions& o) const {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  const std::set<int64_t> placeholders = config_.intern() ? std::set<int64_t>{config_.own_intern.image_token_id}
                                                          : std::set<int64_t>{config_.own3.image_token_id,
                                                                              config_.own3.video_token_id};
  std::vector<int64_t> out;
  while (static_cast<int64_t>(out.size()) < o.max_new_tokens &&
         static_cast<int64_t>(ids.size()) < config_.foundation.max_position_embeddings) {
    const int64_t token = lf::models::sample_token(logits(ids)[-1], o.sampling, gen);
    if (std::find(o.stop_ids.begin(), o.stop_ids.end(), token) != o.stop_ids.end()) break;
    if (placeholders.count(token)) {
      LF_WARN("the model produced the placeholder token ", token, "; generation stops (a placeholder needs a medium)");
      break;
    }
    out.push_back(token);
    ids.push_back(token);
  }
  return out;
}

}  // namespace lf::tools::generate
