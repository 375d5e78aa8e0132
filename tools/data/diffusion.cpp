// loongforge-data's diffusion commands: the latent store from a manifest (`diffusion`), the
// squares demo's store (`make-demo-squares`) and the scorer of its generated clips
// (`score-squares`).
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "loongforge/core/error.h"
#include "loongforge/core/safetensors.h"
#include "loongforge/data/latent_store.h"
#include "loongforge/data/squares_demo.h"
#include "loongforge/data/text_table.h"
#include "loongforge/media/image.h"
#include "loongforge/media/video.h"

namespace lf::data::tools {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Every tensor of a safetensors file as fp32 (F32 / BF16 / F16 stored).
std::map<std::string, at::Tensor> read_tensors(const std::string& path) {
  auto r = lf::safetensors::Reader::open(path);
  std::map<std::string, at::Tensor> out;
  for (const auto& t : r.tensors()) {
    at::ScalarType st;
    switch (t.dtype) {
      case lf::safetensors::DType::F32: st = at::kFloat; break;
      case lf::safetensors::DType::BF16: st = at::kBFloat16; break;
      case lf::safetensors::DType::F16: st = at::kHalf; break;
      default: LF_FAIL(path, ": tensor '", t.name, "' is ", lf::safetensors::dtype_name(t.dtype), ", not a float type");
    }
    at::Tensor x = at::empty(t.shape, st);
    std::memcpy(x.data_ptr(), r.data(t), static_cast<size_t>(t.end - t.begin));
    out[t.name] = x.to(at::kFloat);
  }
  return out;
}

// RGB frames -> [3, F, H, W] in [-1, 1] (the identity "VAE" of pixel-space models).
at::Tensor pixels_of(const std::vector<lf::media::Image>& frames, const std::string& where) {
  LF_CHECK(!frames.empty(), where, ": no frames");
  const int64_t h = frames[0].height, w = frames[0].width, f = static_cast<int64_t>(frames.size());
  at::Tensor out = at::empty({f, h, w, 3}, at::kByte);
  for (int64_t k = 0; k < f; ++k) {
    const auto& im = frames[static_cast<size_t>(k)];
    LF_CHECK(im.height == h && im.width == w, where, ": frame ", k, " is ", im.width, "x", im.height, ", frame 0 is ",
             w, "x", h);
    std::memcpy(out[k].data_ptr(), im.rgb.data(), im.rgb.size());
  }
  return out.permute({3, 0, 1, 2}).to(at::kFloat).div(127.5).sub(1.0).contiguous();
}

}  // namespace

int run_diffusion_store(const DiffusionStoreOptions& o) {
  std::ifstream in(o.manifest);
  LF_CHECK(in.good(), "cannot read the manifest ", o.manifest);
  const fs::path root = o.media_root.empty() ? fs::path(o.manifest).parent_path() : fs::path(o.media_root);
  std::optional<TextTable> table;
  if (!o.text_table.empty()) table = TextTable::read(o.text_table);
  const std::string encoder = table ? "word table " + o.text_table : "precomputed (the manifest's text_embeddings)";
  const std::string vae = "identity (RGB pixels in [-1, 1]) for media lines; precomputed for latents lines";
  LatentStoreWriter writer(o.out, vae, encoder);
  std::string line;
  int64_t n = 0;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = o.manifest + ":" + std::to_string(line_no);
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      LF_FAIL(where, ": not a JSON object: ", e.what());
    }
    auto path = [&](const std::string& p) { return fs::path(p).is_absolute() ? p : (root / p).string(); };
    LatentSample s;
    s.caption = j.value("caption", "");
    if (j.contains("latents")) {
      // Precomputed offline (e.g. diffusers' AutoencoderKLWan): tensor "latents" [C, F, H, W].
      auto t = read_tensors(path(j["latents"].get<std::string>()));
      LF_CHECK(t.count("latents"), where, ": ", j["latents"].get<std::string>(), " holds no tensor 'latents'");
      s.latents = t.at("latents");
      if (s.latents.dim() == 5 && s.latents.size(0) == 1) s.latents = s.latents.squeeze(0);
    } else {
      std::vector<lf::media::Image> frames;
      if (j.contains("video")) {
        frames = lf::media::decode_video(path(j["video"].get<std::string>()));
      } else if (j.contains("frames")) {
        for (const auto& f : j["frames"]) frames.push_back(lf::media::decode_image(path(f.get<std::string>())));
      } else if (j.contains("image")) {
        frames.push_back(lf::media::decode_image(path(j["image"].get<std::string>())));
      } else {
        LF_FAIL(where, ": a line names \"latents\" (precomputed), \"video\", \"frames\" or \"image\"");
      }
      if (o.num_frames > 0) {
        LF_CHECK(static_cast<int64_t>(frames.size()) >= o.num_frames, where, ": ", frames.size(),
                 " frames, --num-frames asks for ", o.num_frames);
        frames.resize(static_cast<size_t>(o.num_frames));
      }
      s.latents = pixels_of(frames, where);
    }
    if (j.contains("text_embeddings")) {
      auto t = read_tensors(path(j["text_embeddings"].get<std::string>()));
      LF_CHECK(t.count("text"), where, ": ", j["text_embeddings"].get<std::string>(), " holds no tensor 'text'");
      s.text = t.at("text");
      if (s.text.dim() == 3 && s.text.size(0) == 1) s.text = s.text.squeeze(0);
    } else {
      LF_CHECK(table.has_value(), where, ": no text_embeddings and no --text-table to encode the caption with",
               lf::hint("give --text-table FILE, or precompute the text embeddings (docs/data.md)"));
      LF_CHECK(!s.caption.empty(), where, ": no caption");
      try {
        s.text = table->encode(s.caption);
      } catch (const lf::Error& e) {
        LF_FAIL(where, ": ", e.what());
      }
    }
    if (j.contains("image_embeddings")) {
      auto t = read_tensors(path(j["image_embeddings"].get<std::string>()));
      LF_CHECK(t.count("image"), where, ": ", j["image_embeddings"].get<std::string>(), " holds no tensor 'image'");
      s.image = t.at("image");
    }
    try {
      writer.add(s);
    } catch (const lf::Error& e) {
      LF_FAIL(where, ": ", e.what());
    }
    ++n;
  }
  const int64_t count = writer.finish();
  std::printf("wrote a latent store of %lld samples to %s\n", static_cast<long long>(count), o.out.c_str());
  return 0;
}

int run_make_demo_squares(const SquaresDemoOptions& o) {
  const TextTable table = squares_text_table(o.text_dim, o.seed);
  fs::create_directories(o.out);
  table.write((fs::path(o.out) / "text_table.safetensors").string());
  LatentStoreWriter writer((fs::path(o.out) / "store").string(), "identity (RGB pixels in [-1, 1])",
                           "word table text_table.safetensors");
  SquaresOptions so;
  so.frames = o.frames;
  so.size = o.size;
  for (int64_t i = 0; i < o.clips; ++i) writer.add(squares_clip(i, o.seed, so, table));
  writer.finish();
  // A few clips as PNG frames, to look at.
  for (int64_t i = 0; i < std::min<int64_t>(o.clips, 4); ++i) {
    const auto s = squares_clip(i, o.seed, so, table);
    const auto px = s.latents.add(1.0).mul(127.5).round().clamp(0, 255).to(at::kByte).permute({1, 2, 3, 0}).contiguous();
    for (int64_t f = 0; f < px.size(0); ++f) {
      lf::media::Image im{px.size(1), px.size(2), std::vector<uint8_t>(static_cast<size_t>(px[f].numel()))};
      std::memcpy(im.rgb.data(), px[f].data_ptr(), im.rgb.size());
      lf::media::write_png(im, (fs::path(o.out) / ("example" + std::to_string(i) + "_frame" + std::to_string(f) + ".png")).string());
    }
  }
  std::printf("wrote %lld clips to %s/store and the text table %s/text_table.safetensors\n",
              static_cast<long long>(o.clips), o.out.c_str(), o.out.c_str());
  return 0;
}

int run_score_squares(const ScoreSquaresOptions& o) {
  auto t = read_tensors(o.latents);
  LF_CHECK(t.count("latents"), o.latents, ": no tensor 'latents' (loongforge-generate's latents.safetensors)");
  const at::Tensor clips = t.at("latents");
  LF_CHECK(clips.dim() == 5 && clips.size(1) == 3, o.latents, ": latents must be [clips, 3, frames, h, w], got ",
           clips.sizes());
  const auto words = TextTable::words_of(o.caption);
  std::string colour, direction;
  for (const auto& w : words) {
    for (const auto& c : squares_colours()) if (w == c) colour = c;
    for (const auto& d : squares_directions()) if (w == d) direction = d;
  }
  LF_CHECK(!colour.empty() && !direction.empty(), "--caption '", o.caption, "' names no colour and direction of the demo");
  int64_t both = 0, col = 0, dir = 0;
  for (int64_t k = 0; k < clips.size(0); ++k) {
    const auto s = score_squares_clip(clips[k], colour, direction);
    col += s.colour_ok;
    dir += s.direction_ok;
    both += s.colour_ok && s.direction_ok;
    if (o.verbose)
      std::printf("clip %lld: %s %s\n", static_cast<long long>(k), s.colour.empty() ? "-" : s.colour.c_str(),
                  s.direction.empty() ? "-" : s.direction.c_str());
  }
  std::printf("{\"caption\": \"%s\", \"clips\": %lld, \"colour_correct\": %lld, \"direction_correct\": %lld, "
              "\"both_correct\": %lld}\n",
              o.caption.c_str(), static_cast<long long>(clips.size(0)), static_cast<long long>(col),
              static_cast<long long>(dir), static_cast<long long>(both));
  return 0;
}

}  // namespace lf::data::tools
