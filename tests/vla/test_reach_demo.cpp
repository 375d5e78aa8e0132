// The reach demo's data (vla/reach_demo.h): the prompt (instruction words, then the gripper state in
// bins), action normalisation, and the store of expert episodes: one sample per step whose label is
// the expert's plan from that observation, read back as written; the position queries and their
// labels (the named block's and target's bins).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <set>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "loongforge/core/error.h"
#include "loongforge/vla/reach_demo.h"
#include "multiprocess.h"

namespace {
using namespace lf::vla;

// The instructed block's and target's centres in env's scene: block x, y, target x, y.
std::array<double, 4> named_positions(const ReachEnv& env) {
  const auto [block, target] = env.task();
  std::array<double, 4> want{};
  for (const auto& b : env.blocks())
    if (b.colour == block) want[0] = b.x, want[1] = b.y;
  for (const auto& t : env.targets())
    if (t.colour == target) want[2] = t.x, want[3] = t.y;
  return want;
}

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
  EXPECT_FALSE(store.get(0).labels.defined());  // no position queries: no labels
}

// --position-queries: the prompt ends with block_x block_y target_x target_y and each sample's
// labels there are the bins of the instructed block's and target's centres in its own frame (the
// block moves once grasped); nowhere else.
TEST(ReachDemo, PositionQueriesAreLabelledWithTheNamedBlockAndTarget) {
  ReachPrompt p;
  p.position_queries = true;
  const auto vocab = p.vocab();
  ASSERT_EQ(vocab.size(), ReachPrompt{}.vocab().size() + 4);
  auto [ids, mask] = p.encode("put the red block on the blue target", at::tensor({0.0f, 0.5f, 1.0f}));
  EXPECT_EQ(mask.sum().item<int64_t>(), 16);
  auto word = [&](const at::Tensor& t, int64_t i) { return vocab[static_cast<size_t>(t[i].item<int64_t>())]; };
  EXPECT_EQ(word(ids, 11), "s31");
  EXPECT_EQ(word(ids, 12), "block_x");
  EXPECT_EQ(word(ids, 15), "target_y");
  auto labels = p.position_labels(ids, {0.0, 0.26, 0.5, 0.99});
  EXPECT_EQ(labels.narrow(0, 0, 12).eq(-100).sum().item<int64_t>(), 12);
  EXPECT_EQ(word(labels, 12), "s0");
  EXPECT_EQ(word(labels, 13), "s8");
  EXPECT_EQ(word(labels, 14), "s16");
  EXPECT_EQ(word(labels, 15), "s31");
  EXPECT_EQ(p.decode_state(ids).size(0), 3);  // the query words are not state bins
  EXPECT_THROW(ReachPrompt{}.position_labels(ids, {0, 0, 0, 0}), lf::Error);

  const std::string dir = lf::testing::make_temp_dir("reach-demo-queries");
  ReachDemoMeta m;
  m.episodes = 2;
  m.seed = 5;
  m.image_size = 24;
  m.prompt.position_queries = true;
  m = write_reach_demos(dir, m);
  ReachDemoStore store(dir);
  EXPECT_TRUE(store.meta().prompt.position_queries);
  ReachOptions o;
  o.image_size = 24;
  ReachEnv env(o);
  auto obs = env.reset(5);
  ReachExpertPolicy expert(m.chunk, o.max_speed);
  bool grasped = false;
  for (int64_t i = 0; i < m.samples; ++i) {
    const auto s = store.get(i);
    ASSERT_TRUE(s.labels.defined());
    grasped = grasped || env.held() >= 0;
    EXPECT_TRUE(at::equal(s.labels, store.meta().prompt.position_labels(s.tokens, named_positions(env))))
        << "sample " << i;
    auto step = env.step(expert.infer(obs)[0]);  // episode 0 has no executed-motion noise
    if (step.done) break;
    obs = step.observation;
  }
  EXPECT_TRUE(grasped) << "the episode should carry the block";
  // --sample-every 3: episode 0 keeps steps 0, 3, 6, ..., episode 1 steps 2, 5, ...: a third of the samples.
  ReachDemoMeta every = m;
  every.sample_every = 3;
  every = write_reach_demos(dir + "-every", every);
  EXPECT_GE(every.samples, m.samples / 3 - 2);
  EXPECT_LE(every.samples, m.samples / 3 + 2);
  ReachDemoStore thirds(dir + "-every");
  EXPECT_EQ(read_reach_demo_meta(dir + "-every").sample_every, 3);
  obs = env.reset(5);
  for (int n = 0; n < 3; ++n) obs = env.step(expert.infer(obs)[0]).observation;
  EXPECT_TRUE(at::equal(thirds.get(0).image, store.get(0).image));
  EXPECT_TRUE(at::equal(thirds.get(1).image, obs.at("observation/image").permute({2, 0, 1})));
  EXPECT_TRUE(at::equal(thirds.get(1).image, store.get(3).image));
  // A store made before position queries (no key in meta.json) reads without them.
  std::ifstream in(dir + "/meta.json");
  auto meta = nlohmann::json::parse(in);
  meta.erase("position_queries");
  meta["vocab"] = ReachPrompt{}.vocab();
  std::ofstream(dir + "/meta.json") << meta.dump();
  EXPECT_FALSE(read_reach_demo_meta(dir).prompt.position_queries);
}

// --scene-queries: sixteen more query words, four per colour, labelled with each colour's block
// and target centre in the scene (-100 for a colour the scene lacks), beside the named queries.
TEST(ReachDemo, SceneQueriesAreLabelledWithEveryObject) {
  ReachPrompt p;
  p.position_queries = true;
  p.scene_queries = true;
  p.length = 32;
  const auto vocab = p.vocab();
  ASSERT_EQ(vocab.size(), ReachPrompt{}.vocab().size() + 20);
  auto id = [&](const std::string& w) { return std::find(vocab.begin(), vocab.end(), w) - vocab.begin(); };
  ReachOptions o;
  o.image_size = 24;
  ReachEnv env(o);
  const auto obs = env.reset(11);
  auto [ids, mask] = p.encode(obs.prompt, obs.at("observation/state"));
  EXPECT_EQ(mask.sum().item<int64_t>(), 32);
  EXPECT_EQ(ids[16].item<int64_t>(), id("red_block_x"));
  EXPECT_EQ(ids[31].item<int64_t>(), id("yellow_target_y"));
  const at::Tensor labels = p.scene_labels(ids, env);
  auto label_at = [&](const std::string& word) {
    for (int64_t i = 0; i < 32; ++i)
      if (ids[i].item<int64_t>() == id(word)) return labels[i].item<int64_t>();
    ADD_FAILURE() << "no " << word;
    return int64_t{-1};
  };
  std::set<int64_t> block_colours, target_colours;
  for (const auto& b : env.blocks()) {
    const std::string c = reach_colours()[static_cast<size_t>(b.colour)];
    block_colours.insert(b.colour);
    EXPECT_EQ(label_at(c + "_block_x"), id(p.bin_word(b.x))) << c;
    EXPECT_EQ(label_at(c + "_block_y"), id(p.bin_word(b.y))) << c;
  }
  for (const auto& t : env.targets()) {
    const std::string c = reach_colours()[static_cast<size_t>(t.colour)];
    target_colours.insert(t.colour);
    EXPECT_EQ(label_at(c + "_target_x"), id(p.bin_word(t.x))) << c;
    EXPECT_EQ(label_at(c + "_target_y"), id(p.bin_word(t.y))) << c;
  }
  for (int64_t c = 0; c < 4; ++c) {
    const std::string name = reach_colours()[static_cast<size_t>(c)];
    if (!block_colours.count(c)) EXPECT_EQ(label_at(name + "_block_x"), -100) << name;
    if (!target_colours.count(c)) EXPECT_EQ(label_at(name + "_target_y"), -100) << name;
  }
  ASSERT_LT(block_colours.size() + target_colours.size(), 8u) << "seed 11 should lack a colour somewhere";
  // The named queries as position_labels gives them, the rest of the prompt unlabelled.
  EXPECT_TRUE(at::equal(labels.narrow(0, 0, 16), p.position_labels(ids, named_positions(env)).narrow(0, 0, 16)));
  EXPECT_THROW(p.query_labels(ids, {{"purple_block_x", 0.5}}), lf::Error);
  ReachPrompt named_only;
  named_only.position_queries = true;
  EXPECT_THROW(named_only.query_labels(ids, {{"red_block_x", 0.5}}), lf::Error);
  // The default prompt length cannot hold them.
  ReachPrompt short_prompt = p;
  short_prompt.length = 16;
  EXPECT_THROW(short_prompt.encode(obs.prompt, obs.at("observation/state")), lf::Error);

  // A store: meta.json keeps the flag, the labels are the scene's at every sample.
  const std::string dir = lf::testing::make_temp_dir("reach-demo-scene-queries");
  ReachDemoMeta m;
  m.episodes = 1;
  m.seed = 11;
  m.image_size = 24;
  m.prompt = p;
  m = write_reach_demos(dir, m);
  ReachDemoStore store(dir);
  EXPECT_TRUE(store.meta().prompt.scene_queries);
  EXPECT_EQ(store.meta().prompt.length, 32);
  const auto first = store.get(0);
  EXPECT_TRUE(at::equal(first.tokens, ids));
  EXPECT_TRUE(at::equal(first.labels, labels));
}

// --located: the prompt ends with the named block's and target's query words in their colours and
// then four answers in a block of their own (ar_mask true at the first); the store holds the true
// answers (the queries' labels as tokens), a policy writes its own with set_answers.
TEST(ReachDemoLocated, PromptsCarryTheNamedQueriesAndTheirAnswers) {
  ReachPrompt p;
  p.located = true;
  p.length = 24;
  const auto vocab = p.vocab();
  EXPECT_EQ(vocab.size(), ReachPrompt{}.vocab().size() + 16);  // the scene query words
  auto id = [&](const std::string& w) { return std::find(vocab.begin(), vocab.end(), w) - vocab.begin(); };
  ReachOptions o;
  o.image_size = 24;
  ReachEnv env(o);
  const auto obs = env.reset(5);
  const auto [block, target] = p.instruction_colours(obs.prompt);
  const auto& colours = reach_colours();
  EXPECT_EQ(block, colours[static_cast<size_t>(env.task().first)]);
  EXPECT_EQ(target, colours[static_cast<size_t>(env.task().second)]);
  auto [ids, mask] = p.encode(obs.prompt, obs.at("observation/state"));
  EXPECT_EQ(mask.sum().item<int64_t>(), 20);  // 8 words, state, 3 bins, 4 queries, 4 answers
  const std::vector<std::string> queries{block + "_block_x", block + "_block_y", target + "_target_x",
                                         target + "_target_y"};
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(ids[12 + i].item<int64_t>(), id(queries[static_cast<size_t>(i)])) << i;
  EXPECT_EQ(p.located_slots(ids), (std::array<int64_t, 4>{12, 13, 14, 15}));
  const at::Tensor ar = p.ar_mask(ids);
  ASSERT_EQ(ar.sizes(), at::IntArrayRef({24}));
  EXPECT_EQ(ar.sum().item<int64_t>(), 1);
  EXPECT_TRUE(ar[16].item<bool>());
  // The labels: the queries' bins, nothing at the answers.
  const auto named = named_positions(env);
  const at::Tensor labels = p.scene_labels(ids, env);
  for (int64_t i = 0; i < 4; ++i)
    EXPECT_EQ(labels[12 + i].item<int64_t>(), id(p.bin_word(named[static_cast<size_t>(i)]))) << i;
  EXPECT_EQ(labels.ge(0).sum().item<int64_t>(), 4);
  // set_answers writes the answers' bins and nothing else; the state still decodes.
  at::Tensor answered = ids.clone();
  p.set_answers(answered, {0.0, 0.99, 0.5, 0.26});
  for (int64_t i = 0; i < 4; ++i)
    EXPECT_EQ(answered[16 + i].item<int64_t>(), id(p.bin_word(std::array<double, 4>{0.0, 0.99, 0.5, 0.26}[i]))) << i;
  EXPECT_TRUE(at::equal(answered.narrow(0, 0, 16), ids.narrow(0, 0, 16)));
  EXPECT_TRUE(at::equal(p.decode_state(answered), p.decode_state(ids)));
  EXPECT_EQ(p.located_slots(answered), p.located_slots(ids));
  // With the scene queries too the located ones are the last four queries (the scene's four per
  // colour come first and have no answers).
  ReachPrompt both = p;
  both.scene_queries = true;
  both.length = 40;
  auto [ids2, mask2] = both.encode(obs.prompt, obs.at("observation/state"));
  EXPECT_EQ(both.located_slots(ids2), (std::array<int64_t, 4>{28, 29, 30, 31}));
  EXPECT_TRUE(both.ar_mask(ids2)[32].item<bool>());
  // Mistakes are named.
  EXPECT_THROW(p.instruction_colours("put the purple block on the red target"), lf::Error);
  EXPECT_THROW(p.encode("move the red block", obs.at("observation/state")), lf::Error);
  EXPECT_THROW(ReachPrompt{}.located_slots(ids), lf::Error);
  EXPECT_FALSE(ReachPrompt{}.ar_mask(ids).defined());
  ReachPrompt short_prompt = p;
  short_prompt.length = 16;
  EXPECT_THROW(short_prompt.encode(obs.prompt, obs.at("observation/state")), lf::Error);
  at::Tensor no_answers = ids.clone();
  no_answers[17] = id("put");
  EXPECT_THROW(p.located_slots(no_answers), lf::Error);
}

TEST(ReachDemoLocated, TheStoreHoldsTheTrueAnswers) {
  const std::string dir = lf::testing::make_temp_dir("reach-demo-located");
  ReachDemoMeta m;
  m.episodes = 2;
  m.seed = 21;
  m.image_size = 24;
  m.chunk = 4;
  m.prompt.located = true;
  m.prompt.length = 24;
  m = write_reach_demos(dir, m);
  ReachDemoStore store(dir);
  EXPECT_TRUE(store.meta().prompt.located);
  const auto vocab = store.meta().prompt.vocab();
  for (int64_t i = 0; i < store.size(); ++i) {
    const auto s = store.get(i);
    ASSERT_TRUE(s.labels.defined() && s.ar_mask.defined());
    const auto slots = store.meta().prompt.located_slots(s.tokens);
    EXPECT_TRUE(at::equal(s.ar_mask, store.meta().prompt.ar_mask(s.tokens)));
    // Each answer token is its query's label (the bin of the true position in that frame).
    for (int64_t q = 0; q < 4; ++q)
      ASSERT_EQ(s.tokens[slots[3] + 1 + q].item<int64_t>(), s.labels[slots[q]].item<int64_t>()) << i << " " << q;
  }
  // Sample 0 against the scene it came from.
  ReachOptions o;
  o.image_size = 24;
  ReachEnv env(o);
  const auto obs = env.reset(21);
  auto [ids, mask] = store.meta().prompt.encode(obs.prompt, obs.at("observation/state"));
  store.meta().prompt.set_answers(ids, named_positions(env));
  EXPECT_TRUE(at::equal(store.get(0).tokens, ids));
  // meta.json records the flag.
  std::ifstream in(dir + "/meta.json");
  auto meta = nlohmann::json::parse(in);
  EXPECT_TRUE(meta.at("located").get<bool>());
}

}  // namespace
