#include "sample.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <tuple>

#include "denoise.h"
#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "loongforge/core/safetensors.h"
#include "loongforge/data/text_table.h"
#include "loongforge/media/image.h"
#include "loongforge/media/video.h"
#include "loongforge/models/blocks/param_builder.h"
#include "loongforge/models/flow_sampler.h"
#include "loongforge/models/wan_diffusers.h"

namespace lf::tools::generate {
namespace {
namespace fs = std::filesystem;
namespace dm = lf::models::diffusers;
using lf::models::WanConfig;

std::string shape_text(at::IntArrayRef s) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < s.size(); ++i) out << (i ? ", " : "") << s[i];
  out << "]";
  return out.str();
}

// "F,H,W" -> three positive integers, checked against the model's patch size and RoPE range.
std::vector<int64_t> parse_latent_shape(const std::string& text, const WanConfig& c) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    LF_CHECK(used == part.size() && !part.empty() && v > 0, "--latent-shape '", text,
             "': expected three positive integers F,H,W (latent frames, height, width)");
    out.push_back(v);
  }
  LF_CHECK(out.size() == 3, "--latent-shape '", text,
           "': expected three positive integers F,H,W (latent frames, height, width)");
  const auto& ps = c.patch_size;
  LF_CHECK(out[0] % ps[0] == 0 && out[1] % ps[1] == 0 && out[2] % ps[2] == 0, "--latent-shape ", text,
           " does not divide into the model's patches of ", ps[0], "x", ps[1], "x", ps[2], " (frames x height x width)",
           lf::hint("give frames, height and width that are multiples of the patch size"));
  LF_CHECK(std::max({out[0] / ps[0], out[1] / ps[1], out[2] / ps[2]}) <= c.rope_max_seq_len, "--latent-shape ", text,
           " makes a grid of ", out[0] / ps[0], "x", out[1] / ps[1], "x", out[2] / ps[2], " patches, past the model's ",
           "rope_max_seq_len ", c.rope_max_seq_len);
  return out;
}

// A [l, d] float tensor of a safetensors file (a copy).
at::Tensor read_text_tensor(const lf::safetensors::Reader& r, const lf::safetensors::TensorInfo& info,
                            const std::string& file, int64_t text_dim) {
  using lf::safetensors::DType;
  static const std::map<DType, at::ScalarType> types{
      {DType::F32, at::kFloat}, {DType::F16, at::kHalf}, {DType::BF16, at::kBFloat16}, {DType::F64, at::kDouble}};
  auto it = types.find(info.dtype);
  LF_CHECK(it != types.end(), "--text-embeddings ", file, ": tensor ", info.name, " has dtype ",
           lf::safetensors::dtype_name(info.dtype), lf::hint("floats (F32, F16, BF16, F64)"));
  LF_CHECK(info.shape.size() == 2 && info.shape[0] > 0 && info.shape[1] == text_dim, "--text-embeddings ", file,
           ": tensor ", info.name, " must be [length, ", text_dim, " (the model's text_dim)], got ",
           shape_text(info.shape));
  at::Tensor t = at::empty(info.shape, it->second);
  std::memcpy(t.data_ptr(), r.data(info), info.end - info.begin);
  return t.to(at::kFloat);
}

struct Texts {
  at::Tensor prompt, negative;  // [l, d] each
  std::string what;
};

Texts read_texts(const SampleOptions& o, const WanConfig& c) {
  Texts out;
  if (!o.text_embeddings.empty()) {
    LF_CHECK(o.prompt.empty() && o.text_table.empty() && o.negative_prompt.empty(),
             "--text-embeddings gives the prompt's embeddings; drop ",
             !o.prompt.empty() ? "--prompt" : !o.text_table.empty() ? "--text-table" : "--negative-prompt",
             lf::hint("either --prompt TEXT --text-table FILE [--negative-prompt TEXT], or --text-embeddings FILE "
                      "with tensors prompt [and negative_prompt]"));
    std::error_code ec;
    LF_CHECK(fs::is_regular_file(o.text_embeddings, ec), "--text-embeddings ", o.text_embeddings, ": no such file");
    const auto r = lf::safetensors::Reader::open(o.text_embeddings);
    for (const auto& info : r.tensors()) {
      LF_CHECK(info.name == "prompt" || info.name == "negative_prompt", "--text-embeddings ", o.text_embeddings,
               ": unknown tensor '", info.name, "'",
               lf::hint("the file holds prompt [length, text_dim] and optionally negative_prompt [length, text_dim]"));
      (info.name == "prompt" ? out.prompt : out.negative) = read_text_tensor(r, info, o.text_embeddings, c.text_dim);
    }
    LF_CHECK(out.prompt.defined(), "--text-embeddings ", o.text_embeddings, ": no tensor 'prompt' [length, ",
             c.text_dim, "]", lf::hint("the text encoder's embeddings of the prompt, e.g. UMT5's for Wan"));
    if (!out.negative.defined()) out.negative = at::zeros_like(out.prompt);
    out.what = "text embeddings " + o.text_embeddings;
    return out;
  }
  LF_CHECK(!o.text_table.empty() && !o.prompt.empty(),
           o.text_table.empty() ? "--prompt on a Wan diffusion transformer needs --text-table FILE (or give "
                                  "--text-embeddings FILE instead)"
                                : "--text-table needs --prompt TEXT",
           lf::hint("either --prompt TEXT --text-table FILE [--negative-prompt TEXT], or --text-embeddings FILE with "
                    "tensors prompt [and negative_prompt]"));
  std::error_code ec;
  LF_CHECK(fs::is_regular_file(o.text_table, ec), "--text-table ", o.text_table, ": no such file");
  const auto table = lf::data::TextTable::read(o.text_table);
  LF_CHECK(table.dim() == c.text_dim, "--text-table ", o.text_table, ": its embeddings are ", table.dim(),
           " wide, the model's text_dim is ", c.text_dim, lf::hint("use the text table the model was trained with"));
  auto encode = [&](const std::string& flag, const std::string& text) {
    try {
      return table.encode(text);
    } catch (const lf::Error& e) {
      LF_FAIL(flag, ": ", e.what());
    }
  };
  out.prompt = encode("--prompt", o.prompt);
  out.negative = encode("--negative-prompt", o.negative_prompt);  // "": all-zero rows
  out.what = "text table " + o.text_table;
  return out;
}

// --first-frame FILE: tensor first_frame [C, 1, H, W] (every sample) or [K, C, 1, H, W] -> [K, C, 1, H, W].
at::Tensor read_first_frame(const std::string& file, const WanConfig& c, const std::vector<int64_t>& shape,
                            int64_t k) {
  std::error_code ec;
  LF_CHECK(fs::is_regular_file(file, ec), "--first-frame ", file, ": no such file");
  LF_CHECK(c.patch_size[0] == 1, "--first-frame: the model's temporal patch size is ", c.patch_size[0],
           "; first-frame conditioning needs 1 (the first frame's tokens alone at timestep 0)");
  const auto r = lf::safetensors::Reader::open(file);
  const lf::safetensors::TensorInfo* info = nullptr;
  for (const auto& t : r.tensors()) {
    LF_CHECK(t.name == "first_frame", "--first-frame ", file, ": unknown tensor '", t.name, "'",
             lf::hint("the file holds first_frame [C, 1, H, W] or [K, C, 1, H, W], the clean first latent frame"));
    info = &t;
  }
  LF_CHECK(info != nullptr, "--first-frame ", file, ": no tensor 'first_frame'");
  LF_CHECK(info->dtype == lf::safetensors::DType::F32, "--first-frame ", file, ": tensor first_frame has dtype ",
           lf::safetensors::dtype_name(info->dtype), lf::hint("float32"));
  const std::vector<int64_t> one = {c.in_channels, 1, shape[1], shape[2]};
  std::vector<int64_t> many = one;
  many.insert(many.begin(), k);
  LF_CHECK(info->shape == one || info->shape == many, "--first-frame ", file, ": tensor first_frame must be ",
           shape_text(one), " or ", shape_text(many), " (channels, 1 frame, the --latent-shape height and width), got ",
           shape_text(info->shape));
  at::Tensor t = at::empty(info->shape, at::kFloat);
  std::memcpy(t.data_ptr(), r.data(*info), info->end - info->begin);
  return t.dim() == 4 ? t.unsqueeze(0).expand(many).contiguous() : t;
}

}  // namespace

at::Tensor sample_noise(const std::vector<int64_t>& shape, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat));
}

std::vector<uint8_t> latent_frame_to_rgb(const at::Tensor& frame) {
  const at::Tensor f = frame.to(at::kCPU, at::kFloat).permute({1, 2, 0}).contiguous();
  const float* p = f.data_ptr<float>();
  std::vector<uint8_t> out(static_cast<size_t>(f.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    const double v = std::round((static_cast<double>(p[i]) + 1.0) / 2.0 * 255.0);
    out[i] = static_cast<uint8_t>(std::clamp(std::isnan(v) ? 0.0 : v, 0.0, 255.0));
  }
  return out;
}

int run_sample(const SampleOptions& o) {
  LF_CHECK(!o.latent_shape.empty() && !o.output_dir.empty(),
           o.latent_shape.empty() ? "sampling a Wan diffusion transformer needs --latent-shape F,H,W (latent frames, "
                                    "height, width)"
                                  : "sampling a Wan diffusion transformer needs --output-dir DIR",
           lf::hint("--latent-shape F,H,W --output-dir DIR with --prompt TEXT --text-table FILE or --text-embeddings "
                    "FILE.safetensors; or one forward: " + std::string(kDenoiseHint)));
  LF_CHECK(o.num_inference_steps >= 1, "--num-inference-steps must be >= 1, got ", o.num_inference_steps);
  LF_CHECK(o.num_samples >= 1, "--num-samples must be >= 1, got ", o.num_samples);
  LF_CHECK(o.sample_shift > 0, "--sample-shift must be > 0, got ", o.sample_shift);
  LF_CHECK(o.fps > 0, "--fps must be > 0, got ", o.fps);
  LF_CHECK(o.load_low_noise.empty() == (o.boundary_ratio < 0),
           o.load_low_noise.empty() ? "--boundary-ratio needs --load-low-noise DIR (the low-noise expert)"
                                    : "--load-low-noise needs --boundary-ratio R (Wan 2.2 A14B text-to-video: 0.875)",
           lf::hint("Wan 2.2 A14B: --load the high-noise expert (transformer/), --load-low-noise the low-noise one "
                    "(transformer_2/), --boundary-ratio as the pipeline's model_index.json says"));
  LF_CHECK(o.boundary_ratio < 0 || (o.boundary_ratio > 0 && o.boundary_ratio < 1), "--boundary-ratio must be in (0, 1), got ",
           o.boundary_ratio);
  LF_CHECK(o.guidance_scale_low < 0 || !o.load_low_noise.empty(), "--guidance-scale-low needs --load-low-noise DIR");
  const auto t0 = std::chrono::steady_clock::now();
  WanModel m = load_wan(o.load, o.iteration, "sampling", o.use_ema);
  const WanConfig& c = m.config;
  LF_CHECK(c.image_dim == 0, "sampling: ", m.what, " is an image-to-video model (image_dim ", c.image_dim,
           "); loongforge-generate samples text-to-video models only",
           lf::hint("run one forward with --denoise-inputs (with encoder_hidden_states_image) instead"));
  LF_CHECK(c.out_dim() == c.in_channels, "sampling: ", m.what, " predicts ", c.out_dim(), " channels from ",
           c.in_channels, " (its input carries conditioning channels); Euler sampling needs the same number");
  const auto shape = parse_latent_shape(o.latent_shape, c);
  Texts texts = read_texts(o, c);

  const auto& be = lf::backend::select_backend();
  const auto dit_ptr = build_wan_dit(m, be, o.bf16);
  const lf::models::WanDit& dit = *dit_ptr;
  // Wan 2.2 A14B's low-noise expert: the same configuration, its own weights.
  std::unique_ptr<lf::models::WanDit> low;
  if (!o.load_low_noise.empty()) {
    WanModel l = load_wan(o.load_low_noise, -1, "--load-low-noise", o.use_ema);
    const WanConfig& lc = l.config;
    for (const auto& [key, mine, theirs] :
         {std::tuple<const char*, int64_t, int64_t>{"in_channels", lc.in_channels, c.in_channels},
          {"out_channels", lc.out_dim(), c.out_dim()},
          {"text_dim", lc.text_dim, c.text_dim},
          {"image_dim", lc.image_dim, c.image_dim},
          {"patch_size (t)", lc.patch_size[0], c.patch_size[0]},
          {"patch_size (h)", lc.patch_size[1], c.patch_size[1]},
          {"patch_size (w)", lc.patch_size[2], c.patch_size[2]}})
      LF_CHECK(mine == theirs, "--load-low-noise ", o.load_low_noise, ": its ", key, " is ", mine, ", --load's ",
               theirs, lf::hint("the two experts of a Wan 2.2 A14B pipeline take the same latents and text"));
    const std::string low_what = l.what;
    low = build_wan_dit(l, be, o.bf16);
    m.what += " + low-noise expert " + low_what + " below timestep " + std::to_string(o.boundary_ratio * 1000);
  }
  LF_INFO("loaded ", m.what, " (wan, ", c.num_parameters(), " parameters, ", be.name(), ", ", o.bf16 ? "bf16" : "fp32",
          ") in ", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), " s");

  const int64_t k = o.num_samples;
  const auto dev = be.device();
  const at::Tensor noise = sample_noise({k, c.in_channels, shape[0], shape[1], shape[2]}, o.seed).to(dev);
  const at::Tensor text = texts.prompt.to(dev).unsqueeze(0).expand({k, -1, -1}).contiguous();
  const at::Tensor negative = texts.negative.to(dev).unsqueeze(0).expand({k, -1, -1}).contiguous();
  lf::models::FlowSamplerOptions so;
  so.num_inference_steps = o.num_inference_steps;
  so.guidance_scale = o.guidance_scale;
  so.shift = o.sample_shift;
  if (low) {
    so.low_noise = [&](const lf::models::WanInputs& in) { return low->forward(in); };
    so.boundary_timestep = o.boundary_ratio * static_cast<double>(so.num_train_timesteps);
    so.guidance_scale_low = o.guidance_scale_low;
  }
  if (!o.first_frame.empty()) so.first_frame = read_first_frame(o.first_frame, c, shape, k).to(dev);
  const auto start = std::chrono::steady_clock::now();
  so.on_step = [&](int64_t i, int64_t n) {
    LF_INFO("step ", i + 1, "/", n, " (", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
            " s)");
  };
  const at::Tensor latents =
      lf::models::flow_euler_sample(dit, noise, text, negative, {}, so).to(at::kCPU, at::kFloat).contiguous();

  fs::create_directories(o.output_dir);
  const std::string file = (fs::path(o.output_dir) / "latents.safetensors").string();
  lf::safetensors::Writer w;
  w.add("latents", lf::safetensors::DType::F32, latents.sizes().vec(), latents.data_ptr());
  w.set_metadata("model", m.what);
  w.set_metadata("text", texts.what);
  w.set_metadata("seed", std::to_string(o.seed));
  w.set_metadata("num_inference_steps", std::to_string(o.num_inference_steps));
  w.set_metadata("guidance_scale", std::to_string(o.guidance_scale));
  w.set_metadata("sample_shift", std::to_string(o.sample_shift));
  w.write(file);
  std::printf("latents %s float32 -> %s (%lld steps, guidance %g, shift %g, seed %llu)\n",
              shape_text(latents.sizes()).c_str(), file.c_str(), static_cast<long long>(o.num_inference_steps),
              o.guidance_scale, o.sample_shift, static_cast<unsigned long long>(o.seed));
  if (c.in_channels != 3) {
    std::printf("these are VAE latents (%lld channels): decode them offline, e.g. with diffusers' AutoencoderKLWan\n",
                static_cast<long long>(c.in_channels));
    return 0;
  }
  // The pixel latent space: every frame as PNG, each sample as an animated GIF.
  for (int64_t s = 0; s < k; ++s) {
    char name[64];
    std::snprintf(name, sizeof(name), "sample_%lld", static_cast<long long>(s));
    const fs::path dir = fs::path(o.output_dir) / name;
    fs::create_directories(dir);
    std::vector<lf::media::Image> frames;
    for (int64_t f = 0; f < shape[0]; ++f) {
      lf::media::Image im;
      im.height = shape[1];
      im.width = shape[2];
      im.rgb = latent_frame_to_rgb(latents[s].select(1, f));
      char frame_name[64];
      std::snprintf(frame_name, sizeof(frame_name), "frame_%02lld.png", static_cast<long long>(f));
      lf::media::write_png(im, (dir / frame_name).string());
      frames.push_back(std::move(im));
    }
    const std::string gif = (fs::path(o.output_dir) / (std::string(name) + ".gif")).string();
    lf::media::write_gif(frames, o.fps, gif);
    std::printf("sample %lld: %lld frames %s/frame_*.png, %s\n", static_cast<long long>(s),
                static_cast<long long>(shape[0]), dir.string().c_str(), gif.c_str());
  }
  return 0;
}

}  // namespace lf::tools::generate
