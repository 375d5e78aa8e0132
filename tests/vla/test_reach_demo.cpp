// The reach demo's data (vla/reach_demo.h): the prompt (instruction words, then the gripper state in
// bins), action normalisation, and the store of expert episodes: one sample per step whose label is
// the expert's plan from that observation, read back as written.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "loongforge/core/error.h"
#include "loongforge/vla/reach_demo.h"
#include "multiprocess.h"

namespace {
using namespace lf::vla;

TEST(ReachDemo, PromptIsTheInstructionWordsThenTheStateBins) {
  ReachPrompt p;  // 32 bins, 16 tokens
  const auto vocab = p.vocab();
  auto [ids, mask] = p.encode("put the red block on the blue target", at::tensor({0.0f, 0.5f, 1.0f}));
  ASSERT_EQ(ids.size(0), 16);
  EXPECT_EQ(mask.sum().item<int64_t>(), 8 + 1 + 3);
  auto word = [&](int64_t i) { return vocab[static_cast<size_t>(ids[i].item<int64_t>())]; };
  EXPECT_EQ(word(0), "put");
  EXPECT_EQ(word(2), "red");
  EXPECT_EQ(word(6), "blue");
  EXPECT_EQ(word(8), "state");
  EXPECT_EQ(word(9), "s0");
  EXPECT_EQ(word(10), "s16");
  EXPECT_EQ(word(11), "s31");  // 1.0 falls in the last bin
  EXPECT_EQ(ids[12].item<int64_t>(), 0);  // padding
  EXPECT_FALSE(mask[12].item<bool>());
  EXPECT_THROW(p.encode("put the purple block on the blue target", at::zeros({3})), lf::Error);
  ReachPrompt short_prompt;
  short_prompt.length = 10;
  EXPECT_THROW(short_prompt.encode("put the red block on the blue target", at::zeros({3})), lf::Error);
  // The state back from its bins, each at its bin's centre (what groot reads from a store).
  auto state = p.decode_state(ids);
  ASSERT_EQ(state.size(0), 3);
  EXPECT_FLOAT_EQ(state[0].item<float>(), 0.5f / 32);
  EXPECT_FLOAT_EQ(state[1].item<float>(), 16.5f / 32);
  EXPECT_FLOAT_EQ(state[2].item<float>(), 31.5f / 32);
  EXPECT_THROW(p.decode_state(at::zeros({16}, at::kLong)), lf::Error);
}

TEST(ReachDemo, ActionsNormaliseToUnitsOfTheMaxSpeed) {
  auto a = at::tensor({0.05f, -0.025f, 1.0f, 0.0f, 0.01f, -1.0f}).view({2, 3});
  auto n = normalize_reach_actions(a, 0.05);
  EXPECT_TRUE(at::allclose(n, at::tensor({1.0f, -0.5f, 1.0f, 0.0f, 0.2f, -1.0f}).view({2, 3})));
  EXPECT_TRUE(at::allclose(unnormalize_reach_actions(n, 0.05), a));
  // Out of range predictions are clipped to the max speed.
  auto big = unnormalize_reach_actions(at::tensor({3.0f, -2.0f, 0.3f}).view({1, 3}), 0.05);
  EXPECT_FLOAT_EQ(big[0][0].item<float>(), 0.05f);
  EXPECT_FLOAT_EQ(big[0][1].item<float>(), -0.05f);
}

TEST(ReachDemo, TheStoreHoldsTheExpertsPlanAtEveryStep) {
  const std::string dir = lf::testing::make_temp_dir("reach-demo");
  ReachDemoMeta m;
  m.episodes = 3;
  m.seed = 11;
  m.image_size = 24;
  m.chunk = 6;
  m = write_reach_demos(dir + "/store", m);
  ReachDemoStore store(dir + "/store");
  ASSERT_EQ(store.size(), m.samples);
  EXPECT_GT(m.samples, 3 * 10);  // every episode takes tens of steps
  EXPECT_EQ(store.meta().image_size, 24);
  EXPECT_EQ(store.meta().chunk, 6);
  // Sample 0 is episode 0's first observation and the expert's plan from it.
  ReachOptions o;
  o.image_size = 24;
  ReachEnv env(o);
  auto obs = env.reset(11);
  ReachExpertPolicy expert(6, o.max_speed);
  const auto s = store.get(0);
  EXPECT_TRUE(at::equal(s.image, obs.at("observation/image").permute({2, 0, 1})));
  EXPECT_TRUE(at::allclose(s.actions, normalize_reach_actions(expert.infer(obs), o.max_speed)));
  auto [ids, mask] = store.meta().prompt.encode(obs.prompt, obs.at("observation/state"));
  EXPECT_TRUE(at::equal(s.tokens, ids));
  EXPECT_TRUE(at::equal(s.mask, mask));
  EXPECT_THROW(store.get(m.samples), lf::Error);
  // A store whose meta.json is not ours is an error naming the file.
  std::filesystem::create_directories(dir + "/bad");
  std::ofstream(dir + "/bad/meta.json") << "{\"format\": \"something else\"}";
  try {
    ReachDemoStore bad(dir + "/bad");
    FAIL() << "no error";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("meta.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ReachDemoStore(dir + "/missing"), lf::Error);
  // A shard that does not fit meta.json (here: meta.json claims another image size) is named; a
  // meta.json without its vocabulary too.
  std::filesystem::create_directories(dir + "/other");
  std::filesystem::copy(dir + "/store/samples-00000.safetensors", dir + "/other/samples-00000.safetensors");
  std::ifstream in(dir + "/store/meta.json");
  auto meta = nlohmann::json::parse(in);
  meta["image_size"] = meta["image_size"].get<int64_t>() * 2;
  std::ofstream(dir + "/other/meta.json") << meta.dump();
  try {
    ReachDemoStore other(dir + "/other");
    FAIL() << "no error";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("samples-00000.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("do not fit meta.json"), std::string::npos) << e.what();
  }
  meta.erase("vocab");
  std::ofstream(dir + "/other/meta.json") << meta.dump();
  try {
    ReachDemoStore other(dir + "/other");
    FAIL() << "no error";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("meta.json"), std::string::npos) << e.what();
  }
}

}  // namespace
