// loongforge-eval: closed-loop evaluation of a policy on the reach-and-place task (vla/reach_env.h):
// N episodes, each from its own seed, the policy asked for an action chunk, the first K actions
// executed, again until the instruction's task is done or the step limit; prints the success rate
// and optionally writes a per-episode JSON report and GIFs of the first episodes.
//   loongforge-eval [--policy expert|random | --policy pi05|groot --load CKPT --data-path STORE
//       | --server ws://HOST:PORT] [--episodes 100] [--seed 0]
//       [--replan-steps K] [--chunk 10] [--instruction-swap] [--max-steps 100] [--image-size 64]
//       [--report FILE.json] [--save-gif DIR [--gif-episodes 3]]
// Single process. Errors become one message on stderr and exit code 1 (2 for usage errors).
#include <ATen/core/Tensor.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>

#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "loongforge/media/video.h"
#include "loongforge/vla/policy.h"
#include "loongforge/vla/reach_env.h"
#include "loongforge/vla/remote_policy.h"

namespace {

struct Options {
  std::string policy = "expert", server, report, save_gif, load, data_path;
  int64_t episodes = 100, replan_steps = 0, chunk = 10, max_steps = 100, image_size = 64, gif_episodes = 3;
  uint64_t seed = 0;
  bool instruction_swap = false;
};

// A GIF frame: the camera image scaled up 4x (nearest), so that a 64-pixel scene is watchable.
lf::media::Image upscale(const lf::media::Image& in, int64_t f) {
  lf::media::Image out;
  out.height = in.height * f, out.width = in.width * f;
  out.rgb.resize(static_cast<size_t>(out.height * out.width * 3));
  for (int64_t y = 0; y < out.height; ++y)
    for (int64_t x = 0; x < out.width; ++x)
      for (int64_t c = 0; c < 3; ++c)
        out.rgb[static_cast<size_t>((y * out.width + x) * 3 + c)] =
            in.rgb[static_cast<size_t>(((y / f) * in.width + x / f) * 3 + c)];
  return out;
}

// "Near" for a decoded position: the reach task's grasp radius, in table units.
const double kNear = lf::vla::ReachOptions{}.grasp_radius;

std::string percent(int64_t n, int64_t of) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", of ? 100.0 * static_cast<double>(n) / static_cast<double>(of) : 0.0);
  return buf;
}

int run(const Options& o) {
  lf::vla::ReachOptions env_options;
  env_options.max_steps = o.max_steps;
  env_options.image_size = o.image_size;
  lf::vla::ReachEnv env(env_options);
  std::unique_ptr<lf::vla::Policy> policy;
  std::string policy_name = o.policy;
  if (!o.server.empty()) {
    policy = lf::vla::connect_openpi_server(o.server);
    policy_name = "server " + o.server;
  } else {
    lf::vla::PolicyOptions po;
    po.seed = o.seed;
    po.chunk = o.chunk;
    po.max_speed = env_options.max_speed;
    po.load = o.load;
    po.data_path = o.data_path;
    policy = lf::vla::make_policy(o.policy, po);
  }
  if (!o.save_gif.empty()) std::filesystem::create_directories(o.save_gif);

  nlohmann::json episodes = nlohmann::json::array();
  int64_t successes = 0, original_done = 0, picked_instructed = 0, picked_other = 0, picked_original = 0;
  // A policy that decodes where the named objects are (pi05 with located answers): its calls, and
  // those that put the instructed block / target within the grasp radius of the truth.
  int64_t located_calls = 0, located_block = 0, located_target = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t e = 0; e < o.episodes; ++e) {
    const uint64_t seed = o.seed + static_cast<uint64_t>(e);
    lf::vla::Observation obs = env.reset(seed, o.instruction_swap);
    policy->reset();
    const bool gif = !o.save_gif.empty() && e < o.gif_episodes;
    std::vector<lf::media::Image> frames;
    if (gif) frames.push_back(upscale(env.render(), 4));
    // Progress short of success: the first block the gripper held, and how close it came to the
    // instructed block before holding it.
    const int64_t want_block = env.task().first;
    int64_t first_held = -1;
    double closest = std::numeric_limits<double>::infinity();
    auto track = [&] {
      if (first_held < 0 && env.held() >= 0) first_held = env.blocks()[static_cast<size_t>(env.held())].colour;
      if (first_held >= 0) return;
      for (const auto& b : env.blocks())
        if (b.colour == want_block) closest = std::min(closest, std::hypot(b.x - env.gripper_x(), b.y - env.gripper_y()));
    };
    track();
    int64_t calls = 0;
    std::vector<std::array<double, 2>> located_errors;  // per call: the decoded block's and target's distance to the truth
    while (!env.done()) {
      const at::Tensor chunk = policy->infer(obs);
      ++calls;
      const auto details = policy->last_details();
      if (details.is_object() && details.contains("located")) {
        const auto where = details.at("located").get<std::vector<double>>();
        LF_CHECK(where.size() == 4, "the policy's located details have ", where.size(), " values, expected 4");
        const auto [block_colour, target_colour] = env.task();
        ++located_calls;
        double block_error = 0, target_error = 0;
        for (const auto& b : env.blocks())
          if (b.colour == block_colour) block_error = std::hypot(where[0] - b.x, where[1] - b.y);
        for (const auto& t : env.targets())
          if (t.colour == target_colour) target_error = std::hypot(where[2] - t.x, where[3] - t.y);
        located_block += block_error <= kNear;
        located_target += target_error <= kNear;
        located_errors.push_back({block_error, target_error});
      }
      LF_CHECK(chunk.dim() == 2 && chunk.size(0) >= 1 && chunk.size(1) == 3, "the policy returned actions of shape ",
               chunk.sizes(), "; the reach task takes chunks [H, 3] (dx, dy, grip)");
      const int64_t k = o.replan_steps > 0 ? std::min(o.replan_steps, chunk.size(0)) : chunk.size(0);
      for (int64_t i = 0; i < k && !env.done(); ++i) {
        obs = env.step(chunk[i]).observation;
        track();
        if (gif) frames.push_back(upscale(env.render(), 4));
      }
    }
    const bool ok = env.success();
    const auto [ob, ot] = env.original_task();
    const bool original = env.task_done(ob, ot);
    successes += ok;
    original_done += original;
    picked_instructed += first_held == want_block;
    picked_other += first_held >= 0 && first_held != want_block;
    if (first_held >= 0 && first_held == env.original_task().first) ++picked_original;
    nlohmann::json ep = {{"episode", e},  {"seed", seed},   {"instruction", env.instruction()},
                         {"success", ok}, {"steps", env.steps()}, {"policy_calls", calls}};
    // Where the episode ended (gripper x, y, grip): two runs with the same per_episode took the same path.
    const at::Tensor last = obs.first_of({"observation/state"}).to(at::kFloat).contiguous().view({-1});
    ep["final_state"] = std::vector<float>(last.data_ptr<float>(), last.data_ptr<float>() + last.numel());
    // The first block held (its colour, null if none) and the gripper's closest approach to the
    // instructed block before that (table units; the grasp radius is the bar to reach).
    ep["first_block_held"] = first_held >= 0 ? nlohmann::json(lf::vla::reach_colours()[static_cast<size_t>(first_held)])
                                             : nlohmann::json(nullptr);
    if (first_held != want_block) ep["closest_to_instructed_block"] = closest;
    if (!located_errors.empty()) ep["located_errors"] = located_errors;
    if (o.instruction_swap) {
      ep["original_instruction"] = lf::vla::reach_instruction(ob, ot);
      ep["original_task_done"] = original;
    }
    if (gif) {
      const std::string path = o.save_gif + "/episode_" + std::to_string(e) + ".gif";
      lf::media::write_gif(frames, 10, path);
      ep["gif"] = path;
    }
    episodes.push_back(ep);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::cout << "loongforge-eval: " << policy_name << " on the reach task, " << o.episodes << " episodes (seeds "
            << o.seed << ".." << o.seed + static_cast<uint64_t>(o.episodes) - 1 << ")"
            << (o.instruction_swap ? ", instructions swapped" : "") << "\n";
  std::cout << "success rate: " << successes << "/" << o.episodes << " (" << percent(successes, o.episodes) << ")\n";
  std::cout << "first block held: the instructed one " << picked_instructed << "/" << o.episodes << ", another "
            << picked_other << "/" << o.episodes
            << (o.instruction_swap ? ", the original instruction's " + std::to_string(picked_original) + "/" +
                                         std::to_string(o.episodes)
                                   : std::string())
            << "\n";
  if (located_calls > 0)
    std::cout << "located by the policy (within " << kNear << " of the truth): the instructed block in " << located_block
              << "/" << located_calls << " calls, the instructed target in " << located_target << "/" << located_calls
              << "\n";
  if (o.instruction_swap)
    std::cout << "original task done: " << original_done << "/" << o.episodes << " ("
              << percent(original_done, o.episodes) << ") (a policy that follows the instruction does the swapped "
              << "task, not the original)\n";
  if (!o.report.empty()) {
    nlohmann::json r = {{"policy", o.server.empty() ? o.policy : "server"},
                        {"episodes", o.episodes},
                        {"seed", o.seed},
                        {"replan_steps", o.replan_steps},
                        {"max_steps", o.max_steps},
                        {"image_size", o.image_size},
                        {"instruction_swap", o.instruction_swap},
                        {"successes", successes},
                        {"first_held_instructed", picked_instructed},
                        {"first_held_other", picked_other},
                        {"success_rate", o.episodes ? static_cast<double>(successes) / static_cast<double>(o.episodes) : 0.0},
                        {"seconds", seconds},
                        {"per_episode", episodes}};
    if (!o.server.empty()) r["server"] = o.server;
    if (located_calls > 0)
      r["located"] = {{"calls", located_calls}, {"instructed_block_near", located_block},
                      {"instructed_target_near", located_target}, {"near", kNear}};
    if (o.instruction_swap) {
      r["original_task_done"] = original_done;
      r["first_held_original"] = picked_original;
      r["original_task_rate"] = o.episodes ? static_cast<double>(original_done) / static_cast<double>(o.episodes) : 0.0;
    }
    std::ofstream out(o.report);
    LF_CHECK(out.good(), "cannot write the report ", o.report);
    out << r.dump(2) << "\n";
    LF_CHECK(out.good(), "cannot write the report ", o.report);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string choices;
  for (const auto& [name, what] : lf::vla::policy_names()) choices += (choices.empty() ? "" : ", ") + name + " (" + what + ")";
  CLI::App app{"loongforge-eval: closed-loop evaluation of a policy on the reach-and-place task"};
  app.add_option("--policy", o.policy, "The policy: " + choices)->capture_default_str();
  app.add_option("--server", o.server,
                 "Evaluate the policy a server speaking OpenPI's websocket protocol serves (ws://HOST:PORT, e.g. "
                 "loongforge-serve-policy), instead of --policy");
  app.add_option("--load", o.load, "--policy pi05 / groot: the trained policy's checkpoint directory");
  app.add_option("--data-path", o.data_path,
                 "--policy pi05 / groot: the reach demo store it was trained on (its image size, prompt vocabulary, action "
                 "scale)");
  app.add_option("--episodes", o.episodes, "Episodes to run")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--seed", o.seed, "Episode e's scene is drawn from seed + e (and the random policy from seed)")
      ->capture_default_str();
  app.add_option("--replan-steps", o.replan_steps,
                 "Execute the first K actions of each chunk before asking the policy again (0: the whole chunk)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--chunk", o.chunk, "The scripted policies' chunk length H (actions per call)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1000}));
  app.add_flag("--instruction-swap", o.instruction_swap,
               "Tell the policy the instruction with its colours swapped (\"put the blue block on the red target\" for "
               "red / blue); success is then the swapped task, and the original task's rate is printed too: a policy "
               "that reads the instruction does the swapped task");
  app.add_option("--max-steps", o.max_steps, "Steps per episode at most")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{100000}));
  app.add_option("--image-size", o.image_size, "The camera image's side in pixels")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{16}, int64_t{1024}));
  app.add_option("--report", o.report, "Write a JSON report with per-episode results");
  app.add_option("--save-gif", o.save_gif, "Write the first --gif-episodes episodes as DIR/episode_<e>.gif (4x scaled)");
  app.add_option("--gif-episodes", o.gif_episodes, "With --save-gif: how many episodes")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  lf::log::init(lf::log::options_from_env(-1, 1));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (const auto unknown = lf::vla::unknown_policy_message(o.policy); !unknown.empty()) {
    std::cerr << "loongforge-eval: error: " << unknown << "\n";
    return 2;
  }
  if ((o.policy == "pi05" || o.policy == "groot") && app.count("--chunk")) {
    std::cerr << "loongforge-eval: error: --chunk sets the scripted policies' chunk; a trained policy predicts the chunk it "
                 "was trained for (pi05: model.chunk_size, groot: model.action_horizon)\n";
    return 2;
  }
  if (!o.server.empty() &&
      (app.count("--policy") || app.count("--chunk") || app.count("--load") || app.count("--data-path"))) {
    std::cerr << "loongforge-eval: error: --server evaluates the server's policy (its own chunk and checkpoint); drop "
                 "--policy, --chunk, --load and --data-path\n";
    return 2;
  }
  if (app.count("--gif-episodes") && o.save_gif.empty()) {
    std::cerr << "loongforge-eval: error: --gif-episodes needs --save-gif DIR\n";
    return 2;
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    lf::log::flush();
    std::cerr << "loongforge-eval: error: " << e.what() << "\n";
    return 1;
  }
}
