#include "denoise.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "loongforge/backend/registry.h"
#include "loongforge/core/config/yaml.h"
#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "loongforge/core/safetensors.h"
#include "loongforge/models/blocks/param_builder.h"
#include "loongforge/models/wan_checkpoint.h"
#include "loongforge/models/wan_diffusers.h"
#include "loongforge/train/checkpoint.h"
#include "loongforge/train/checkpoint_format.h"

namespace lf::tools::generate {
namespace {
namespace fs = std::filesystem;
namespace dm = lf::models::diffusers;
using lf::models::WanConfig;

// The model type a checkpoint's config.yaml names ("" when it names none).
std::string checkpoint_model_type(const std::string& resolved) {
  const fs::path file = fs::path(resolved) / "config.yaml";
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return "";
  std::ifstream in(file);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const auto root = lf::config::parse_yaml_string(text, lf::config::Origin::from_file(file.string(), 1));
  const auto* model = root.find("model");
  const auto* type = model ? model->find("type") : nullptr;
  return type && type->is_scalar() ? type->text() : "";
}

// Every tensor of the inputs file, as at::Tensor (a copy: the mapping may be unaligned).
std::map<std::string, at::Tensor> read_inputs(const std::string& file) {
  using lf::safetensors::DType;
  static const std::map<DType, at::ScalarType> types{{DType::F32, at::kFloat}, {DType::F16, at::kHalf},
                                                     {DType::BF16, at::kBFloat16}, {DType::F64, at::kDouble},
                                                     {DType::I64, at::kLong}, {DType::I32, at::kInt}};
  static const std::set<std::string> known{"hidden_states", "timestep", "encoder_hidden_states",
                                           "encoder_hidden_states_image"};
  const auto r = lf::safetensors::Reader::open(file);
  std::map<std::string, at::Tensor> out;
  for (const auto& info : r.tensors()) {
    if (info.name == "prediction") continue;  // an oracle's file may carry the expected output
    LF_CHECK(known.count(info.name), "--denoise-inputs ", file, ": unknown tensor '", info.name, "'",
             lf::hint("hidden_states, timestep, encoder_hidden_states and (I2V) encoder_hidden_states_image, as "
                      "diffusers' WanTransformer3DModel takes them"));
    auto it = types.find(info.dtype);
    LF_CHECK(it != types.end(), "--denoise-inputs ", file, ": tensor ", info.name, " has dtype ",
             lf::safetensors::dtype_name(info.dtype), lf::hint("floats (F32, F16, BF16, F64); timestep may be I64 / I32"));
    LF_CHECK(info.name == "timestep" || at::isFloatingType(it->second), "--denoise-inputs ", file, ": tensor ",
             info.name, " has dtype ", lf::safetensors::dtype_name(info.dtype), lf::hint("floats (F32, F16, BF16, F64)"));
    at::Tensor t = at::empty(info.shape, it->second);
    std::memcpy(t.data_ptr(), r.data(info), info.end - info.begin);
    out[info.name] = t;
  }
  return out;
}

// The inputs against the model, each problem an error naming the tensor and the file.
lf::models::WanInputs check_inputs(std::map<std::string, at::Tensor> t, const WanConfig& c, const std::string& file) {
  const std::string where = "--denoise-inputs " + file + ": ";
  for (const auto& [name, shape] : {std::pair<const char*, const char*>{"hidden_states", "[b, c, f, h, w]"},
                                    {"timestep", "[b] or [b, tokens]"},
                                    {"encoder_hidden_states", "[b, l, text_dim]"}})
    LF_CHECK(t.count(name), where, "no tensor '", name, "' ", shape,
             lf::hint("the file holds hidden_states, timestep, encoder_hidden_states (and encoder_hidden_states_image "
                      "for I2V) as diffusers' WanTransformer3DModel takes them"));
  lf::models::WanInputs in;
  in.latents = t["hidden_states"].to(at::kFloat);
  const auto& x = in.latents;
  const auto& ps = c.patch_size;
  LF_CHECK(x.dim() == 5 && x.size(1) == c.in_channels, where, "hidden_states must be [b, ", c.in_channels,
           " (in_channels), frames, height, width], got ", x.sizes());
  LF_CHECK(x.size(0) > 0 && x.size(2) % ps[0] == 0 && x.size(3) % ps[1] == 0 && x.size(4) % ps[2] == 0, where,
           "hidden_states ", x.sizes(), " does not divide into patches of ", ps[0], "x", ps[1], "x", ps[2]);
  const int64_t b = x.size(0), f = x.size(2) / ps[0], h = x.size(3) / ps[1], w = x.size(4) / ps[2];
  LF_CHECK(std::max({f, h, w}) <= c.rope_max_seq_len, where, "hidden_states makes a grid of ", f, "x", h, "x", w,
           " patches, past rope_max_seq_len ", c.rope_max_seq_len);
  in.timestep = t["timestep"].to(at::kFloat);
  const int64_t tokens = f * h * w;
  LF_CHECK((in.timestep.dim() == 1 && in.timestep.size(0) == b) ||
               (in.timestep.dim() == 2 && in.timestep.size(0) == b && in.timestep.size(1) == tokens),
           where, "timestep must be [", b, "] or [", b, ", ", tokens, "] (one per patch token), got ",
           in.timestep.sizes());
  in.text = t["encoder_hidden_states"].to(at::kFloat);
  LF_CHECK(in.text.dim() == 3 && in.text.size(0) == b && in.text.size(2) == c.text_dim, where,
           "encoder_hidden_states must be [", b, ", length, ", c.text_dim, " (text_dim)], got ", in.text.sizes());
  const bool has_image = t.count("encoder_hidden_states_image");
  LF_CHECK(has_image == (c.image_dim > 0), where,
           c.image_dim > 0 ? "no tensor 'encoder_hidden_states_image': the model is an I2V model (image_dim " +
                                 std::to_string(c.image_dim) + ")"
                           : std::string("tensor 'encoder_hidden_states_image' given to a text-only model (no image_dim)"),
           lf::hint(c.image_dim > 0 ? "add the image encoder's features [b, tokens, image_dim]"
                                    : "drop encoder_hidden_states_image, or --load the I2V model"));
  if (has_image) {
    in.image = t["encoder_hidden_states_image"].to(at::kFloat);
    const int64_t rows = c.pos_embed_seq_len > 0 ? 2 * b : b;  // FLF2V: first and last frame stacked
    LF_CHECK(in.image.dim() == 3 && in.image.size(0) == rows && in.image.size(2) == c.image_dim &&
                 (c.pos_embed_seq_len == 0 || 2 * in.image.size(1) == c.pos_embed_seq_len),
             where, "encoder_hidden_states_image must be [", rows, ", ",
             c.pos_embed_seq_len > 0 ? std::to_string(c.pos_embed_seq_len / 2) : std::string("tokens"), ", ",
             c.image_dim, " (image_dim)], got ", in.image.sizes());
  }
  return in;
}

}  // namespace

WanModel load_wan(const std::string& dir, int64_t iteration, const std::string& mode, bool ema) {
  WanModel m;
  if (dm::is_wan_dir(dir)) {
    LF_CHECK(!ema, "--use-ema: ", dir, " is a diffusers WanTransformer3DModel directory, which keeps one set of weights",
             lf::hint("drop --use-ema; a LoongForge checkpoint trained with --ema-decay keeps EMA weights (or export "
                      "them: loongforge-convert lf2hf --ema)"));
    m.config = dm::read_wan_config(dir);
    m.tensors = dm::read_wan_weights(dir, at::kFloat);
    m.what = "diffusers WanTransformer3DModel " + dir;
    return m;
  }
  const auto resolved = lf::train::ckpt::resolve_checkpoint_dir(dir, iteration);
  LF_CHECK(resolved.has_value(), mode, " needs a Wan model; ", dir,
           " is neither a diffusers WanTransformer3DModel directory (config.json with _class_name "
           "WanTransformer3DModel) nor a LoongForge checkpoint",
           lf::hint("--load the transformer/ directory of a diffusers Wan pipeline, or a checkpoint of a "
                    "flow_matching model (loongforge-train, loongforge-convert hf2lf)"));
  const std::string type = checkpoint_model_type(*resolved);
  LF_CHECK(type == dm::kWanComposite, mode, " needs a Wan model; ", dir, " is a checkpoint of a ",
           type.empty() ? std::string("model without a model type") : type + " model",
           lf::hint(mode + " is for flow_matching (Wan) models; a language model takes --prompt, "
                    "--input-ids or --eval-file"));
  lf::train::FullModel full;
  try {
    full = lf::train::read_model_checkpoint(dir, iteration, ema);
  } catch (const lf::Error& e) {
    if (ema && std::string(e.what()).find("keeps no EMA weights") != std::string::npos)
      LF_FAIL("--use-ema: checkpoint ", dir, " keeps no EMA weights",
              lf::hint("train with --ema-decay D to keep them, or drop --use-ema"));
    throw;
  }
  const std::string source = dir + " (iteration " + std::to_string(full.iteration) + ")";
  m.config = *dm::wan_config_from_model_section(full.config_yaml, source + " config.yaml");
  for (auto& [name, t] : full.tensors) m.tensors[name] = t.to(at::kFloat);
  m.what = "LoongForge checkpoint " + source + (ema ? ", EMA weights" : "");
  return m;
}

bool is_wan_model(const std::string& dir, int64_t iteration) {
  if (dm::is_wan_dir(dir)) return true;
  try {
    const auto resolved = lf::train::ckpt::resolve_checkpoint_dir(dir, iteration);
    return resolved && checkpoint_model_type(*resolved) == dm::kWanComposite;
  } catch (const lf::Error&) {
    return false;  // not a readable checkpoint: the usual loading reports what is wrong
  }
}

std::unique_ptr<lf::models::WanDit> build_wan_dit(WanModel& m, const lf::backend::DeviceBackend& backend, bool bf16) {
  lf::models::ParamBuilder b(at::make_generator<at::CPUGeneratorImpl>(0), bf16 ? at::kBFloat16 : at::kFloat,
                             backend.device(), lf::parallel::TensorParallel{}, /*trainable=*/false);
  auto dit = std::make_unique<lf::models::WanDit>(m.config, backend, b, /*seed=*/0, /*tp_rank=*/0);
  dm::load_into(b.params(), m.tensors, m.what);
  m.tensors.clear();
  dit->set_training(false);
  return dit;
}

int run_denoise(const DenoiseOptions& o) {
  LF_CHECK(!o.inputs.empty() && !o.prediction.empty(),
           o.inputs.empty() ? "--dump-prediction needs --denoise-inputs FILE.safetensors (the forward's inputs)"
                            : "--denoise-inputs needs --dump-prediction OUT.safetensors (where the prediction goes)",
           lf::hint(kDenoiseHint));
  std::error_code ec;
  LF_CHECK(fs::is_regular_file(o.inputs, ec), "--denoise-inputs ", o.inputs, ": no such file");
  const auto t0 = std::chrono::steady_clock::now();
  WanModel m = load_wan(o.load, o.iteration, "--denoise-inputs", /*ema=*/false);
  const auto& c = m.config;
  lf::models::WanInputs in = check_inputs(read_inputs(o.inputs), c, o.inputs);

  const auto& be = lf::backend::select_backend();
  const auto dit_ptr = build_wan_dit(m, be, o.bf16);
  const lf::models::WanDit& dit = *dit_ptr;
  LF_INFO("loaded ", m.what, " (wan, ", c.num_parameters(), " parameters, ", be.name(), ", ",
          o.bf16 ? "bf16" : "fp32", ") in ", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
          " s");

  at::NoGradGuard no_grad;
  const auto dev = be.device();
  in.latents = in.latents.to(dev);
  in.timestep = in.timestep.to(dev);
  in.text = in.text.to(dev);
  if (in.image.defined()) in.image = in.image.to(dev);
  const at::Tensor pred = dit.forward(in).to(at::kCPU, at::kFloat).contiguous();
  lf::safetensors::Writer w;
  w.add("prediction", lf::safetensors::DType::F32, pred.sizes().vec(), pred.data_ptr());
  w.set_metadata("model", m.what);
  w.write(o.prediction);
  std::printf("prediction [");
  for (int64_t i = 0; i < pred.dim(); ++i) std::printf("%s%lld", i ? ", " : "", static_cast<long long>(pred.size(i)));
  std::printf("] float32 -> %s\n", o.prediction.c_str());
  return 0;
}

}  // namespace lf::tools::generate
