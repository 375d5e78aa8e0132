// Native checkpoint format and offline entry points (train/checkpoint.h, checkpoint_format.h):
// model-only checkpoints written at TP x PP and read back bit for bit, resharding, every kind of
// damage (flipped byte, truncation, missing shard, bad manifest/tracker) as an lf::Error naming
// the file, and crash safety: the saving process is killed (SIGKILL) at >= 20 random moments and
// at every step of the commit protocol; the tracker must always name a checkpoint that loads,
// and every earlier checkpoint must still load.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <iostream>
#include <random>
#include <thread>

#include "loongforge/core/error.h"
#include "error_message.h"
#include "loongforge/models/composites/causal_lm.h"
#include "loongforge/train/checkpoint.h"
#include "loongforge/train/checkpoint_format.h"
#include "multiprocess.h"

namespace {
namespace fs = std::filesystem;
using lf::train::ckpt::CheckpointReader;

// Tensors named and shaped like a 2-layer SwiGLU decoder (h 16, f 24, 4 heads of 4, 2 groups),
// with `vocab` embedding rows; values depend on `salt` so every iteration's content differs.
std::vector<std::pair<std::string, at::Tensor>> model_tensors(int64_t salt, int64_t vocab = 64) {
  const int64_t h = 16, f = 24, qkv = 2 * (2 + 2) * 4;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"embedding.word_embeddings.weight", {vocab, h}}};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "decoder.layers." + std::to_string(l) + ".";
    shapes.push_back({p + "input_layernorm.weight", {h}});
    shapes.push_back({p + "self_attention.linear_qkv.weight", {qkv, h}});
    shapes.push_back({p + "self_attention.linear_proj.weight", {h, 16}});
    shapes.push_back({p + "pre_mlp_layernorm.weight", {h}});
    shapes.push_back({p + "mlp.linear_fc1.weight", {2 * f, h}});
    shapes.push_back({p + "mlp.linear_fc2.weight", {h, f}});
  }
  shapes.push_back({"decoder.final_layernorm.weight", {h}});
  shapes.push_back({"output_layer.weight", {vocab, h}});
  std::vector<std::pair<std::string, at::Tensor>> out;
  int64_t k = 0;
  for (auto& [n, s] : shapes) {
    int64_t numel = 1;
    for (auto d : s) numel *= d;
    at::Tensor t = (at::arange(numel, at::kFloat) * 1e-3f + static_cast<float>(salt + k++)).reshape(s);
    out.emplace_back(n, t);
  }
  return out;
}

// The shardings the model itself records for those tensors (what the HF converter passes).
std::map<std::string, lf::parallel::Sharding> shardings(int64_t vocab = 64) {
  lf::models::DecoderConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.ffn_hidden_size = 24;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.vocab_size = vocab;
  c.max_position_embeddings = 16;
  c.untie_embeddings_and_output_weights = true;
  return lf::models::causal_lm_shardings(c);
}

void expect_equal_models(const std::vector<std::pair<std::string, at::Tensor>>& want,
                         const lf::train::FullModel& got, const std::string& what) {
  ASSERT_EQ(got.tensors.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got.tensors[i].first, want[i].first) << what;
    EXPECT_TRUE(at::equal(got.tensors[i].second, want[i].second)) << what << ": " << want[i].first;
  }
}

TEST(CheckpointFormat, ModelCheckpointRoundTripsAtTp2Pp2) {
  auto dir = lf::testing::make_temp_dir("ckpt-roundtrip");
  auto tensors = model_tensors(7);
  lf::train::write_model_checkpoint(dir, 42, tensors, shardings(), "model: tiny\n", 2, 2);
  for (const char* f : {"model_tp0_pp0.safetensors", "model_tp1_pp0.safetensors", "model_tp0_pp1.safetensors",
                        "model_tp1_pp1.safetensors", "manifest.json", "state.json", "config.yaml"})
    EXPECT_TRUE(fs::exists(fs::path(dir) / "iter_0000042" / f)) << f;
  EXPECT_EQ(lf::train::ckpt::read_tracker(dir).value_or(-1), 42);
  EXPECT_FALSE(fs::exists(fs::path(dir) / "iter_0000042.tmp"));
  auto got = lf::train::read_model_checkpoint(dir);
  EXPECT_EQ(got.iteration, 42);
  EXPECT_EQ(got.config_yaml, "model: tiny\n");
  expect_equal_models(tensors, got, "tp2 pp2");
  // Shard metadata: fc1 of TP rank 1 holds [gate_1; up_1] of the [48, 16] tensor.
  CheckpointReader r(fs::path(dir) / "iter_0000042");
  auto spec = r.layout_of("decoder.layers.1.mlp.linear_fc1.weight");
  EXPECT_EQ(spec.global_shape, (std::vector<int64_t>{48, 16}));
  EXPECT_EQ(spec.partition_dim, 0);
  EXPECT_EQ(spec.blocks, 2);
  EXPECT_EQ(spec.tp_size, 2);
}

TEST(CheckpointFormat, VocabularyPaddingAdaptsToTheLayout) {
  auto dir = lf::testing::make_temp_dir("ckpt-vocab");
  auto tensors = model_tensors(3, /*vocab=*/63);  // 63 rows do not split over TP 2: padded to 64
  lf::train::write_model_checkpoint(dir, 1, tensors, shardings(), "", 2, 1);
  auto got = lf::train::read_model_checkpoint(dir);
  const at::Tensor emb = got.tensors.front().second;
  ASSERT_EQ(emb.size(0), 64);
  EXPECT_TRUE(at::equal(emb.narrow(0, 0, 63), tensors.front().second));
  EXPECT_EQ(emb[63].count_nonzero().item<int64_t>(), 0);
  // Loading into a model with 63 rows drops the zero row; 62 rows would drop real data.
  CheckpointReader r(fs::path(dir) / "iter_0000001");
  lf::train::ckpt::ShardSpec want;
  want.vocab = true;
  want.global_shape = {63, 16};
  EXPECT_TRUE(at::equal(r.shard("embedding.word_embeddings.weight", "param", want, at::kFloat),
                        tensors.front().second));
  want.global_shape = {62, 16};
  EXPECT_NE(lf::testing::error_message([&] { r.shard("embedding.word_embeddings.weight", "param", want, at::kFloat); })
                .find("not padding"),
            std::string::npos);
  want.global_shape = {64, 17};
  EXPECT_NE(lf::testing::error_message([&] { r.shard("embedding.word_embeddings.weight", "param", want, at::kFloat); })
                .find("the model expects [64,17]"),
            std::string::npos);
}

// Experts split over ep 2 x tp 2 (Sharding::outer): rank r holds expert part r / 2 and, within
// it, TP piece r % 2 of each [gate; up] block; the four shards unshard to the full tensor, and the
// shard record (ShardSpec) reports the same shape and first element of each block.
TEST(CheckpointFormat, TwoLevelSplitOfExpertsRoundTrips) {
  using lf::parallel::Sharding;
  const at::Tensor full = at::arange(4 * 8 * 3, at::kFloat).reshape({4, 8, 3});  // [E 4, 2 f (f 4), h 3]
  const Sharding s = Sharding::within_parts(2, Sharding::along(1, 2));
  std::vector<at::Tensor> shards;
  for (int r = 0; r < 4; ++r) {
    at::Tensor piece = s.shard(full, r, 4);
    ASSERT_EQ(piece.sizes().vec(), (std::vector<int64_t>{2, 4, 3}));
    EXPECT_EQ(s.shard_shape(full.sizes().vec(), 4), piece.sizes().vec());
    EXPECT_EQ(s.full_shape(piece.sizes().vec(), 4), full.sizes().vec());
    const int64_t e0 = (r / 2) * 2, f0 = (r % 2) * 2;  // first expert, first row within each block
    EXPECT_EQ(s.offsets(full.sizes().vec(), r, 4), (std::vector<int64_t>{e0, f0, 0}));
    EXPECT_TRUE(at::equal(piece.narrow(1, 0, 2), full.narrow(0, e0, 2).narrow(1, f0, 2))) << "gate of rank " << r;
    EXPECT_TRUE(at::equal(piece.narrow(1, 2, 2), full.narrow(0, e0, 2).narrow(1, 4 + f0, 2))) << "up of rank " << r;
    lf::train::ckpt::ShardSpec spec;
    spec.global_shape = full.sizes().vec();
    spec.partition_dim = 1;
    spec.blocks = 2;
    spec.outer = 2;
    spec.tp_rank = r;
    spec.tp_size = 4;
    EXPECT_NO_THROW(spec.validate("fc1"));
    EXPECT_EQ(spec.shard_shape(), piece.sizes().vec());
    EXPECT_TRUE(at::equal(lf::train::ckpt::cut_shard(full, spec), piece));
    shards.push_back(piece);
  }
  EXPECT_TRUE(at::equal(s.unshard(shards), full));
  // Three experts do not cut into two parts; a part split along dim 0 is no two-level split.
  EXPECT_THROW(s.check({3, 8, 3}, 4, "fc1"), lf::Error);
  EXPECT_THROW(Sharding::within_parts(2, Sharding::along(0)).check({4, 8, 3}, 4, "fc1"), lf::Error);
  lf::train::ckpt::ShardSpec odd;
  odd.global_shape = {4, 8, 3};
  odd.partition_dim = 1;
  odd.outer = 3;
  odd.tp_size = 6;
  EXPECT_NE(lf::testing::error_message([&] { odd.validate("fc1"); }).find("bad two-level split"), std::string::npos);
  odd.outer = 2;
  odd.tp_size = 4;
  odd.partition_dim = -1;  // parts without a split inside them: no record the model writes
  EXPECT_NE(lf::testing::error_message([&] { odd.validate("fc1"); }).find("bad two-level split"), std::string::npos);
}

TEST(CheckpointFormat, ReshardKeepsEveryTensor) {
  auto a = lf::testing::make_temp_dir("ckpt-reshard-a"), b = lf::testing::make_temp_dir("ckpt-reshard-b");
  auto tensors = model_tensors(11);
  lf::train::write_model_checkpoint(a, 5, tensors, shardings(), "x: 1\n", 1, 1);
  lf::train::reshard_checkpoint(a, b, 2, 2, 2);
  EXPECT_TRUE(fs::exists(fs::path(b) / "iter_0000005" / "model_tp1_pp1.safetensors"));
  auto got = lf::train::read_model_checkpoint(b);
  EXPECT_EQ(got.iteration, 5);
  EXPECT_EQ(got.config_yaml, "x: 1\n");
  expect_equal_models(tensors, got, "resharded");
  EXPECT_NE(lf::testing::error_message([&] { lf::train::reshard_checkpoint(a, a, 2, 1, 1); }).find("being read"), std::string::npos);
}

TEST(CheckpointFormat, DamageIsAnErrorNamingTheFile) {
  auto tensors = model_tensors(1);
  auto fresh = [&](const std::string& tag) {
    auto dir = lf::testing::make_temp_dir("ckpt-damage-" + tag);
    lf::train::write_model_checkpoint(dir, 3, tensors, shardings(), "", 2, 1);
    return dir;
  };
  const std::string shard = "iter_0000003/model_tp1_pp0.safetensors";
  {  // one flipped byte in the data
    auto dir = fresh("flip");
    std::fstream f(fs::path(dir) / shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x7f');
    f.close();
    auto msg = lf::testing::error_message([&] { lf::train::read_model_checkpoint(dir); });
    EXPECT_NE(msg.find("model_tp1_pp0.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("checksum"), std::string::npos) << msg;
  }
  {  // truncated
    auto dir = fresh("trunc");
    fs::resize_file(fs::path(dir) / shard, fs::file_size(fs::path(dir) / shard) - 100);
    auto msg = lf::testing::error_message([&] { lf::train::read_model_checkpoint(dir); });
    EXPECT_NE(msg.find("model_tp1_pp0.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  }
  {  // a missing shard
    auto dir = fresh("missing");
    fs::remove(fs::path(dir) / shard);
    auto msg = lf::testing::error_message([&] { lf::train::read_model_checkpoint(dir); });
    EXPECT_NE(msg.find("model_tp1_pp0.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  }
  {  // a malformed manifest
    auto dir = fresh("manifest");
    std::ofstream(fs::path(dir) / "iter_0000003/manifest.json") << "{\"format\": ";
    auto msg = lf::testing::error_message([&] { lf::train::read_model_checkpoint(dir); });
    EXPECT_NE(msg.find("manifest.json"), std::string::npos) << msg;
  }
  {  // a manifest from a newer format is refused; version 1 (before two-level splits) still reads
    auto dir = fresh("version");
    const auto manifest = fs::path(dir) / "iter_0000003/manifest.json";
    std::stringstream text;
    text << std::ifstream(manifest).rdbuf();
    const std::string current = text.str(), key = "\"version\": " + std::to_string(lf::train::ckpt::kFormatVersion);
    ASSERT_NE(current.find(key), std::string::npos) << current;
    auto with_version = [&](int v) {
      std::string m = current;
      m.replace(m.find(key), key.size(), "\"version\": " + std::to_string(v));
      std::ofstream(manifest) << m;
    };
    with_version(lf::train::ckpt::kFormatVersion + 1);
    auto msg = lf::testing::error_message([&] { lf::train::read_model_checkpoint(dir); });
    EXPECT_NE(msg.find("has format version 3; this build reads 1 to 2"), std::string::npos) << msg;
    with_version(1);
    expect_equal_models(tensors, lf::train::read_model_checkpoint(dir), "version 1");
  }
  {  // a tracker that is not a number, and one naming an absent iteration
    auto dir = fresh("tracker");
    std::ofstream(fs::path(dir) / "latest_checkpointed_iteration.txt") << "banana\n";
    auto msg = lf::testing::error_message([&] { lf::train::read_model_checkpoint(dir); });
    EXPECT_NE(msg.find("latest_checkpointed_iteration.txt"), std::string::npos) << msg;
    std::ofstream(fs::path(dir) / "latest_checkpointed_iteration.txt") << "9\n";
    msg = lf::testing::error_message([&] { lf::train::read_model_checkpoint(dir); });
    EXPECT_NE(msg.find("iter_0000009"), std::string::npos) << msg;
  }
  {  // no checkpoint at all
    auto dir = lf::testing::make_temp_dir("ckpt-empty");
    EXPECT_FALSE(lf::train::ckpt::resolve_checkpoint_dir(dir).has_value());
    auto msg = lf::testing::error_message([&] { lf::train::read_model_checkpoint(dir); });
    EXPECT_NE(msg.find("holds no checkpoint"), std::string::npos) << msg;
  }
}

TEST(CheckpointFormat, ResavingAnIterationReplacesIt) {
  auto dir = lf::testing::make_temp_dir("ckpt-resave");
  lf::train::write_model_checkpoint(dir, 4, model_tensors(1), shardings(), "", 1, 1);
  lf::train::write_model_checkpoint(dir, 4, model_tensors(2), shardings(), "", 2, 1);
  expect_equal_models(model_tensors(2), lf::train::read_model_checkpoint(dir), "re-saved");
  EXPECT_FALSE(fs::exists(fs::path(dir) / ".iter_0000004.old"));
}

// ---- crash safety ------------------------------------------------------------------------------

// Kills the process (SIGKILL) at the N-th point (0-based) a save passes: after each file, the
// manifest, the rename, the tracker.
struct CrashAt : lf::train::SaveHooks {
  explicit CrashAt(long at) : at(at) {}
  void at_save_point(const char*) override {
    if (at >= 0 && count++ == at) raise(SIGKILL);
  }
  long at, count = 0;
};

// The saving process: commits iterations tracker+1, tracker+2, ... until killed.
LF_WORKER_CASE(checkpoint_save_loop) {
  const std::string dir = lf::testing::worker_args().at(0);
  const auto& args = lf::testing::worker_args();
  CrashAt hooks(args.size() > 1 ? std::atol(args[1].c_str()) : -1);
  int64_t it = lf::train::ckpt::read_tracker(dir).value_or(0) + 1;
  for (;; ++it) lf::train::write_model_checkpoint(dir, it, model_tensors(it, 256), shardings(256), "", 2, 1, &hooks);
}

pid_t start_saver(const std::string& dir, const std::string& crash_at) {
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("LF_TEST_WORKER", "checkpoint_save_loop", 1);
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    dup2(devnull, 2);
    execl("/proc/self/exe", "/proc/self/exe", dir.c_str(), crash_at.empty() ? "-1" : crash_at.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// The invariants after a crash: the tracker names a checkpoint that loads with the content of its
// iteration, and so does every other iter_* directory.
void check_after_crash(const std::string& dir, int64_t& last_seen, const std::string& what) {
  auto tracked = lf::train::ckpt::read_tracker(dir);
  if (!tracked) return;  // killed before the first commit
  EXPECT_GE(*tracked, last_seen) << what;
  last_seen = *tracked;
  try {
    auto m = lf::train::read_model_checkpoint(dir);
    EXPECT_EQ(m.iteration, *tracked);
    expect_equal_models(model_tensors(*tracked, 256), m, what + ": latest");
  } catch (const lf::Error& e) {
    ADD_FAILURE() << what << ": the tracked checkpoint " << *tracked << " does not load: " << e.what();
  }
  for (const auto& e : fs::directory_iterator(dir))
    if (auto it = lf::train::ckpt::parse_iteration_dir(e.path().filename().string()); it && *it != *tracked) {
      try {
        expect_equal_models(model_tensors(*it, 256), lf::train::read_model_checkpoint(dir, *it),
                            what + ": iteration " + std::to_string(*it));
      } catch (const lf::Error& err) {
        ADD_FAILURE() << what << ": earlier checkpoint " << *it << " does not load: " << err.what();
      }
    }
}

TEST(CheckpointCrashSafety, KilledAtRandomMomentsDuringSaves) {
  auto dir = lf::testing::make_temp_dir("ckpt-kill");
  std::mt19937 rng(20261202);
  int64_t last_seen = 0;
  int mid_save = 0;
  const int kills = 24;
  for (int k = 0; k < kills; ++k) {
    const int64_t before = lf::train::ckpt::read_tracker(dir).value_or(0);
    const pid_t pid = start_saver(dir, "");
    // Wait for this process's first commit, then kill it after a random delay (a save takes a
    // few milliseconds here, so the delays land in every phase of the following saves).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (lf::train::ckpt::read_tracker(dir).value_or(0) == before && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 20000)(rng)));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the saver exited by itself (status " << status << ")";
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().ends_with(".tmp")) ++mid_save;
    check_after_crash(dir, last_seen, "random kill " + std::to_string(k));
  }
  std::cout << kills << " kills, " << mid_save << " of them in the middle of writing a checkpoint; last "
            << "committed iteration " << last_seen << "\n";
  EXPECT_GE(mid_save, 5);  // the kills really hit saves in progress
}

TEST(CheckpointCrashSafety, KilledAtEveryStepOfTheCommit) {
  // Per save: 2 shard files, state.json/config.yaml (not hooked), manifest, rename, tracker = 5
  // points; 0..9 covers every point of a first and of a second save.
  for (int point = 0; point < 10; ++point) {
    auto dir = lf::testing::make_temp_dir("ckpt-point-" + std::to_string(point));
    const pid_t pid = start_saver(dir, std::to_string(point));
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "point " << point;
    int64_t last_seen = 0;
    check_after_crash(dir, last_seen, "crash point " + std::to_string(point));
    // The expected tracker: points 0-2 are before the first commit's rename.
    const auto tracked = lf::train::ckpt::read_tracker(dir);
    if (point <= 3) EXPECT_FALSE(tracked.has_value()) << point;
    if (point >= 4 && point <= 8) EXPECT_EQ(tracked.value_or(-1), 1) << point;
    if (point == 9) EXPECT_EQ(tracked.value_or(-1), 2) << point;
    // A new save after the crash cleans up and commits.
    lf::train::write_model_checkpoint(dir, 7, model_tensors(7, 256), shardings(256), "", 1, 1);
    EXPECT_EQ(lf::train::read_model_checkpoint(dir).iteration, 7);
    for (const auto& e : fs::directory_iterator(dir))
      EXPECT_FALSE(e.path().filename().string().ends_with(".tmp")) << e.path();
  }
}

}  // namespace
