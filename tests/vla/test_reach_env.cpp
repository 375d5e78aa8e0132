// The reach-and-place task (reach_env.h): scenes deterministic per seed, the rendered camera image,
// grasp / carry / drop, success detection, the scripted policies (the expert succeeds, random does
// not; a swapped instruction changes what the expert does) and make_policy.
#include <gtest/gtest.h>

#include <ATen/Functions.h>

#include "loongforge/core/error.h"
#include "loongforge/vla/policy.h"
#include "loongforge/vla/reach_env.h"

namespace {
using namespace lf::vla;

PolicyOptions options(uint64_t seed, int64_t chunk = 10) {
  PolicyOptions o;
  o.seed = seed, o.chunk = chunk;
  return o;
}

// Runs one episode; returns whether the instruction's task was done.
bool run_episode(ReachEnv& env, Policy& policy, uint64_t seed, bool swap = false, int64_t replan = 0) {
  Observation obs = env.reset(seed, swap);
  policy.reset();
  while (!env.done()) {
    const at::Tensor chunk = policy.infer(obs);
    const int64_t k = replan > 0 ? std::min(replan, chunk.size(0)) : chunk.size(0);
    for (int64_t i = 0; i < k && !env.done(); ++i) obs = env.step(chunk[i]).observation;
  }
  return env.success();
}

TEST(ReachEnv, ScenesAreDeterministicPerSeed) {
  ReachEnv a, b;
  const Observation oa = a.reset(7), ob = b.reset(7);
  EXPECT_EQ(oa.prompt, ob.prompt);
  for (const auto& [name, t] : oa.arrays) EXPECT_TRUE(at::equal(t, ob.at(name))) << name;
  // Other seeds give other scenes; every scene holds the task's block and target, 2-4 blocks of
  // distinct colours and 2-3 targets, and the swapped task's too.
  int differ = 0;
  for (uint64_t s = 0; s < 200; ++s) {
    const Observation o = b.reset(s);
    differ += !at::equal(o.at("observation/image"), oa.at("observation/image"));
    const auto [bc, tc] = b.task();
    EXPECT_NE(bc, tc);
    EXPECT_EQ(o.prompt, reach_instruction(bc, tc));
    ASSERT_GE(b.blocks().size(), 2u);
    ASSERT_LE(b.blocks().size(), 4u);
    ASSERT_GE(b.targets().size(), 2u);
    ASSERT_LE(b.targets().size(), 3u);
    std::set<int64_t> bcs, tcs;
    for (const auto& k : b.blocks()) bcs.insert(k.colour);
    for (const auto& t : b.targets()) tcs.insert(t.colour);
    EXPECT_EQ(bcs.size(), b.blocks().size());
    EXPECT_EQ(tcs.size(), b.targets().size());
    EXPECT_TRUE(bcs.count(bc) && bcs.count(tc) && tcs.count(bc) && tcs.count(tc));
    EXPECT_FALSE(b.success());  // no block starts on a target
    EXPECT_FALSE(b.task_done(tc, bc));
  }
  EXPECT_GE(differ, 199);
  // The swapped instruction names the swapped task of the same scene.
  b.reset(7, true);
  EXPECT_EQ(b.original_task(), a.task());
  EXPECT_EQ(b.task(), (std::pair<int64_t, int64_t>{a.task().second, a.task().first}));
  EXPECT_EQ(b.instruction(), reach_instruction(a.task().second, a.task().first));
}

TEST(ReachEnv, ObservationShapesAndTheRenderedScene) {
  ReachOptions o;
  o.image_size = 96;
  ReachEnv env(o);
  env.set_scene({{0.2, 0.3, 0}, {0.8, 0.2, 2}}, {{0.5, 0.75, 2}, {0.2, 0.75, 0}}, 0.9, 0.9, {0, 2});
  EXPECT_EQ(env.instruction(), "put the red block on the blue target");
  const Observation obs = env.observe();
  const at::Tensor img = obs.at("observation/image");
  EXPECT_EQ(img.scalar_type(), at::kByte);
  EXPECT_EQ(img.sizes(), (std::vector<int64_t>{96, 96, 3}));
  EXPECT_EQ(obs.at("observation/state").scalar_type(), at::kFloat);
  EXPECT_TRUE(at::allclose(obs.at("observation/state"), at::tensor({0.9f, 0.9f, 0.0f})));
  EXPECT_EQ(obs.at("env/blocks").sizes(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(obs.at("env/held").item<int64_t>(), -1);
  auto pixel = [&](double x, double y) {
    const at::Tensor p = img[static_cast<int64_t>(y * 96)][static_cast<int64_t>(x * 96)];
    return std::array<uint8_t, 3>{p[0].item<uint8_t>(), p[1].item<uint8_t>(), p[2].item<uint8_t>()};
  };
  EXPECT_EQ(pixel(0.2, 0.3), reach_colour_rgb(0));  // the red block at its position
  EXPECT_EQ(pixel(0.8, 0.2), reach_colour_rgb(2));  // the blue block
  EXPECT_EQ(pixel(0.5 - 0.099, 0.75), reach_colour_rgb(2));  // the blue target's left edge
  EXPECT_NE(pixel(0.5, 0.75), reach_colour_rgb(2));          // an outline: its inside is the table
  EXPECT_EQ(pixel(0.9, 0.9), (std::array<uint8_t, 3>{255, 255, 255}));  // the gripper
  EXPECT_EQ(pixel(0.5, 0.5), (std::array<uint8_t, 3>{60, 60, 60}));     // the table
}

TEST(ReachEnv, GraspCarryDropAndSuccess) {
  ReachEnv env;
  env.set_scene({{0.2, 0.2, 0}, {0.26, 0.2, 1}}, {{0.7, 0.7, 2}, {0.3, 0.7, 1}}, 0.1, 0.2, {0, 2});
  // Motion is clipped to max_speed per component; closing away from any block grasps nothing.
  auto s = env.step(1.0, 0.0, 1.0);
  EXPECT_NEAR(env.gripper_x(), 0.15, 1e-12);
  EXPECT_TRUE(env.gripper_closed());
  EXPECT_EQ(env.held(), 0);  // 0.05 from the red block: within the grasp radius
  env.step(0, 0, -1);
  EXPECT_EQ(env.held(), -1);
  EXPECT_NEAR(env.blocks()[0].x, 0.15, 1e-12);  // dropped where it was carried
  // Closing between two blocks grasps the nearer one.
  env.set_scene({{0.2, 0.2, 0}, {0.26, 0.2, 1}}, {{0.7, 0.7, 2}, {0.3, 0.7, 1}}, 0.24, 0.2, {0, 2});
  env.step(0, 0, 1);
  EXPECT_EQ(env.held(), 1);
  env.step(0, 0, -1);
  // Carry the red block onto the blue target: done only once the gripper opens.
  env.set_scene({{0.2, 0.2, 0}, {0.5, 0.2, 1}}, {{0.7, 0.7, 2}, {0.3, 0.7, 1}}, 0.2, 0.2, {0, 2});
  env.step(0, 0, 1);
  ASSERT_EQ(env.held(), 0);
  for (int i = 0; i < 10; ++i) s = env.step(0.05, 0.05, 1);
  EXPECT_NEAR(env.blocks()[0].x, 0.7, 1e-9);
  EXPECT_NEAR(env.blocks()[0].y, 0.7, 1e-9);
  EXPECT_FALSE(s.success);  // still held
  s = env.step(0, 0, -1);
  EXPECT_TRUE(s.success);
  EXPECT_TRUE(s.done);
  EXPECT_TRUE(env.task_done(0, 2));
  EXPECT_FALSE(env.task_done(0, 1));
  EXPECT_FALSE(env.task_done(1, 2));
  // A block only partly inside its target does not count; the gripper stays on the table.
  // (A block of side 0.08 is wholly inside a 0.2 zone up to 0.06 from its centre.)
  env.set_scene({{0.65, 0.7, 0}}, {{0.7, 0.7, 2}}, 0.0, 0.0, {0, 2});
  EXPECT_TRUE(env.task_done(0, 2));
  env.set_scene({{0.63, 0.7, 0}}, {{0.7, 0.7, 2}}, 0.0, 0.0, {0, 2});
  EXPECT_FALSE(env.task_done(0, 2));
  env.step(-1, -1, 0);
  EXPECT_EQ(env.gripper_x(), 0.0);
  EXPECT_EQ(env.gripper_y(), 0.0);
  // The step limit ends an episode.
  ReachOptions o;
  o.max_steps = 3;
  ReachEnv short_env(o);
  short_env.reset(1);
  for (int i = 0; i < 2; ++i) EXPECT_FALSE(short_env.step(0, 0, 0).done);
  EXPECT_TRUE(short_env.step(0, 0, 0).done);
  // Bad actions are errors.
  EXPECT_THROW(env.step(at::zeros({2})), lf::Error);
  EXPECT_THROW(env.step(NAN, 0, 0), lf::Error);
}

TEST(ReachEnv, Instructions) {
  EXPECT_EQ(parse_reach_instruction("put the red block on the blue target"), (std::pair<int64_t, int64_t>{0, 2}));
  EXPECT_EQ(parse_reach_instruction("Put the Yellow block on the green target."), (std::pair<int64_t, int64_t>{3, 1}));
  EXPECT_THROW(parse_reach_instruction("stack the blocks"), lf::Error);
  EXPECT_THROW(parse_reach_instruction("put the pink block on the blue target"), lf::Error);
}

TEST(ReachPolicies, ExpertSucceedsAndRandomDoesNot) {
  ReachEnv env;
  auto expert = make_policy("expert");
  auto random = make_policy("random", options(3));
  int expert_ok = 0, random_ok = 0, replan_ok = 0;
  for (uint64_t s = 0; s < 100; ++s) {
    expert_ok += run_episode(env, *expert, 1000 + s);
    replan_ok += run_episode(env, *expert, 1000 + s, false, 3);
    random_ok += run_episode(env, *random, 1000 + s);
  }
  EXPECT_GE(expert_ok, 95);
  EXPECT_GE(replan_ok, 95);
  EXPECT_LT(random_ok, 5);
  std::cout << "expert " << expert_ok << "/100, random " << random_ok << "/100\n";
}

TEST(ReachPolicies, ExpertChunksAndTheSwappedInstruction) {
  ReachEnv env;
  env.set_scene({{0.2, 0.2, 0}, {0.8, 0.3, 2}}, {{0.7, 0.7, 2}, {0.3, 0.7, 0}}, 0.5, 0.5, {0, 2});
  ReachExpertPolicy expert(8);
  Observation obs = env.observe();
  at::Tensor a = expert.infer(obs);
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{8, 3}));
  EXPECT_EQ(a.scalar_type(), at::kFloat);
  // Towards the red block (up and left), gripper open.
  EXPECT_NEAR(a[0][0].item<float>(), -0.05f, 1e-6);
  EXPECT_NEAR(a[0][1].item<float>(), -0.05f, 1e-6);
  EXPECT_LT(a[0][2].item<float>(), 0);
  // The same scene told the swapped instruction: towards the blue block (right, up).
  obs.prompt = "put the blue block on the red target";
  a = expert.infer(obs);
  EXPECT_NEAR(a[0][0].item<float>(), 0.05f, 1e-6);
  EXPECT_NEAR(a[0][1].item<float>(), -0.05f, 1e-6);
  // The state may come as "state"; the instruction and the env/ arrays are required.
  obs.arrays["state"] = obs.arrays.at("observation/state");
  obs.arrays.erase("observation/state");
  EXPECT_NO_THROW(expert.infer(obs));
  Observation no_env = obs;
  no_env.arrays.erase("env/blocks");
  EXPECT_THROW(expert.infer(no_env), lf::Error);
  obs.prompt = "put the green block on the red target";  // no green block here
  EXPECT_THROW(expert.infer(obs), lf::Error);

  // Over whole episodes: told the swapped instruction, the expert does the swapped task and not
  // the original one.
  int swapped = 0, original = 0;
  for (uint64_t s = 0; s < 20; ++s) {
    swapped += run_episode(env, expert, s, true);
    original += env.task_done(env.original_task().first, env.original_task().second);
  }
  EXPECT_GE(swapped, 19);
  EXPECT_EQ(original, 0);
}

TEST(ReachPolicies, MakePolicy) {
  EXPECT_EQ(make_policy("expert")->metadata()["action_dim"], 3);
  EXPECT_EQ(make_policy("random", options(0, 4))->infer({}).sizes(), (std::vector<int64_t>{4, 3}));
  try {
    make_policy("pi0");
    FAIL() << "no error";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown policy 'pi0'; the choices are: expert, random"), std::string::npos)
        << e.what();
  }
  PolicyOptions with_load;
  with_load.load = "/tmp/x";
  EXPECT_THROW(make_policy("expert", with_load), lf::Error);
  // The random policy: within its ranges, reproducible from its seed, different chunk to chunk.
  auto r1 = make_policy("random", options(5)), r2 = make_policy("random", options(5));
  const at::Tensor a = r1->infer({}), b = r2->infer({}), c = r1->infer({});
  EXPECT_TRUE(at::equal(a, b));
  EXPECT_FALSE(at::equal(a, c));
  EXPECT_LE(a.narrow(1, 0, 2).abs().max().item<float>(), 0.05f);
  EXPECT_LE(a.select(1, 2).abs().max().item<float>(), 1.0f);
}

}  // namespace
