#include "policy.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "loongforge/backend/registry.h"
#include "loongforge/core/config/yaml.h"
#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "loongforge/core/safetensors.h"
#include "loongforge/models/pi05_lerobot.h"
#include "loongforge/train/checkpoint.h"
#include "loongforge/train/checkpoint_format.h"

namespace lf::tools::generate {
namespace {
namespace fs = std::filesystem;
namespace lr = lf::models::lerobot;

struct PolicyModel {
  lr::Pi05Setup setup;
  std::map<std::string, at::Tensor> tensors;
  std::string what;
};

// The pi05 setup of a checkpoint's config.yaml, or nullopt (another model, or no config).
std::optional<lr::Pi05Setup> checkpoint_setup(const std::string& resolved) {
  const fs::path file = fs::path(resolved) / "config.yaml";
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return std::nullopt;
  std::ifstream in(file);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  return lr::pi05_setup_from_model_section(text, file.string());
}

PolicyModel load_policy(const std::string& dir, int64_t iteration) {
  PolicyModel m;
  if (lr::is_pi05_dir(dir)) {
    m.setup = lr::read_pi05_setup(dir);
    m.tensors = lr::read_pi05_weights(dir, at::kFloat);
    m.what = "LeRobot pi05 policy " + dir;
    return m;
  }
  const auto resolved = lf::train::ckpt::resolve_checkpoint_dir(dir, iteration);
  LF_CHECK(resolved.has_value(), "--policy-inputs needs a pi05 policy; ", dir,
           " is neither a LeRobot pi05 directory (config.json with \"type\": \"pi05\") nor a LoongForge checkpoint",
           lf::hint("--load what PI05Policy.save_pretrained wrote, or a checkpoint of a pi05 model"));
  LF_CHECK(checkpoint_setup(*resolved).has_value(), "--policy-inputs needs a pi05 policy; ", dir,
           " is a checkpoint of another model", lf::hint(kPolicyHint));
  auto full = lf::train::read_model_checkpoint(dir, iteration);
  m.setup = *lr::pi05_setup_from_model_section(full.config_yaml, dir + " config.yaml");
  for (auto& [name, t] : full.tensors) m.tensors[name] = t.to(at::kFloat);
  m.what = "LoongForge checkpoint " + dir + " (iteration " + std::to_string(full.iteration) + ")";
  return m;
}

std::map<std::string, at::Tensor> read_inputs(const std::string& file) {
  using lf::safetensors::DType;
  static const std::map<DType, at::ScalarType> types{
      {DType::F32, at::kFloat}, {DType::F16, at::kHalf}, {DType::BF16, at::kBFloat16}, {DType::F64, at::kDouble},
      {DType::I64, at::kLong},  {DType::I32, at::kInt},  {DType::U8, at::kByte},       {DType::BOOL, at::kBool}};
  static const std::set<std::string> known{"images", "img_masks", "tokens", "masks", "actions", "noise", "time"};
  const auto r = lf::safetensors::Reader::open(file);
  std::map<std::string, at::Tensor> out;
  for (const auto& info : r.tensors()) {
    LF_CHECK(known.count(info.name), "--policy-inputs ", file, ": unknown tensor '", info.name, "'",
             lf::hint("images, img_masks, tokens, masks, actions, noise, time as LeRobot's PI05Pytorch takes them"));
    auto it = types.find(info.dtype);
    LF_CHECK(it != types.end(), "--policy-inputs ", file, ": tensor ", info.name, " has dtype ",
             lf::safetensors::dtype_name(info.dtype));
    at::Tensor t = at::empty(info.shape, it->second);
    std::memcpy(t.data_ptr(), r.data(info), info.end - info.begin);
    out[info.name] = t;
  }
  return out;
}

void write_tensor(const std::string& path, const std::string& name, const at::Tensor& t) {
  const at::Tensor c = t.to(at::kFloat).contiguous();
  lf::safetensors::Writer w;
  w.add(name, lf::safetensors::DType::F32, c.sizes().vec(), c.data_ptr());
  std::error_code ec;
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path(), ec);
  w.write(path);
}

}  // namespace

bool is_policy_model(const std::string& dir, int64_t iteration) {
  if (lr::is_pi05_dir(dir)) return true;
  try {
    const auto resolved = lf::train::ckpt::resolve_checkpoint_dir(dir, iteration);
    return resolved && checkpoint_setup(*resolved).has_value();
  } catch (const lf::Error&) {
    return false;
  }
}

int run_policy(const PolicyOptions& o) {
  LF_CHECK(!o.inputs.empty(), "--dump-loss and --dump-actions need --policy-inputs FILE.safetensors",
           lf::hint(kPolicyHint));
  LF_CHECK(!o.loss.empty() || !o.actions.empty(),
           "--policy-inputs needs --dump-loss OUT.safetensors and/or --dump-actions OUT.safetensors (what to write)",
           lf::hint(kPolicyHint));
  std::error_code ec;
  LF_CHECK(fs::is_regular_file(o.inputs, ec), "--policy-inputs ", o.inputs, ": no such file");
  const auto t0 = std::chrono::steady_clock::now();
  PolicyModel m = load_policy(o.load, o.iteration);
  auto t = read_inputs(o.inputs);
  const std::string where = "--policy-inputs " + o.inputs + ": ";
  for (const char* name : {"images", "img_masks", "tokens", "masks", "noise"})
    LF_CHECK(t.count(name), where, "no tensor '", name, "'", lf::hint(kPolicyHint));
  if (!o.loss.empty())
    for (const char* name : {"actions", "time"})
      LF_CHECK(t.count(name), where, "--dump-loss needs tensor '", name, "'", lf::hint(kPolicyHint));
  lf::models::Pi05Inputs in;
  in.images = t["images"].to(at::kFloat);
  LF_CHECK(in.images.dim() == 5 && in.images.size(2) == 3, where, "images must be [n_cam, b, 3, H, W], got ",
           in.images.sizes());
  in.img_masks = t["img_masks"].to(at::kBool);
  in.tokens = t["tokens"].to(at::kLong);
  in.masks = t["masks"].to(at::kBool);

  const auto& be = lf::backend::select_backend();
  const auto& s = m.setup;
  lf::models::Pi05 model(s.vision, s.vlm, s.expert, s.policy, be, 0, at::kFloat, nullptr);
  model.load_full(m.tensors, m.what);
  m.tensors.clear();
  LF_INFO("loaded ", m.what, " (pi05, ", be.name(), ") in ",
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), " s");
  at::NoGradGuard no_grad;
  try {
    if (!o.loss.empty()) {
      auto loss = model.losses(in, t["actions"].to(at::kFloat), t["noise"].to(at::kFloat), t["time"].to(at::kFloat));
      write_tensor(o.loss, "loss", loss);
      std::printf("wrote loss %s (mean %.6g) to %s\n", c10::str(loss.sizes()).c_str(), loss.mean().item<double>(),
                  o.loss.c_str());
    }
    if (!o.actions.empty()) {
      auto actions = model.sample_actions(in, t["noise"].to(at::kFloat), o.steps);
      write_tensor(o.actions, "actions", actions);
      std::printf("wrote actions %s (%lld Euler steps) to %s\n", c10::str(actions.sizes()).c_str(),
                  static_cast<long long>(o.steps > 0 ? o.steps : s.policy.num_inference_steps), o.actions.c_str());
    }
  } catch (const lf::Error& e) {
    LF_FAIL(where, e.what());
  }
  return 0;
}

}  // namespace lf::tools::generate
