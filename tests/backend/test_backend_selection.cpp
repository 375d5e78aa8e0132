// Backend selection and loading: LOONGFORGE_DEVICE rules, the clear errors for cuda without a
// GPU, a missing CUDA module, and missing / ABI-skewed / entry-less XPU plugins; plus the CPU
// backend's memory statistics, RNG state, events, and that a CPU process never maps
// libtorch_cuda.
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "loongforge/backend/registry.h"
#include "loongforge/backend/xpu_plugin_abi.h"
#include "loongforge/core/error.h"
#include "multiprocess.h"

namespace lf::testing {
namespace {

// Sets (or unsets, with nullopt) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) setenv(name, value->c_str(), 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::string lib(const std::string& name) { return binary_dir() + "/lib/lib" + name + ".so"; }

// Runs f, expecting lf::Error whose text contains every needle.
template <class F>
void expect_error(F&& f, std::initializer_list<std::string> needles) {
  try {
    f();
    ADD_FAILURE() << "expected lf::Error";
  } catch (const lf::Error& e) {
    const std::string what = e.what();
    for (const auto& n : needles) EXPECT_NE(what.find(n), std::string::npos) << "'" << n << "' not in: " << what;
  }
}

TEST(BackendSelection, DeviceEnvironmentPicksTheBackend) {
  {
    ScopedEnv dev("LOONGFORGE_DEVICE", "cpu");
    EXPECT_EQ(backend::select_backend().name(), "cpu");
    EXPECT_EQ(backend::select_backend().device(), c10::Device(c10::DeviceType::CPU));
  }
  {
    ScopedEnv dev("LOONGFORGE_DEVICE", std::nullopt);
    EXPECT_EQ(backend::default_device_name(), backend::cuda_device_visible() ? "cuda" : "cpu");
  }
  {
    ScopedEnv dev("LOONGFORGE_DEVICE", "tpu");
    expect_error([] { backend::select_backend(); }, {"'tpu'", "cpu, cuda, xpu"});
  }
  {
    ScopedEnv vis("CUDA_VISIBLE_DEVICES", "");
    EXPECT_FALSE(backend::cuda_device_visible());
  }
}

TEST(BackendSelection, XpuWithTheReferencePluginWorks) {
  ScopedEnv dev("LOONGFORGE_DEVICE", "xpu");
  ScopedEnv plugin("LOONGFORGE_XPU_PLUGIN", lib("loongforge_xpu_reference"));
  const auto& be = backend::select_backend();
  EXPECT_EQ(be.name(), "xpu");
  EXPECT_TRUE(be.is_available());
  auto y = be.ops().swiglu_fwd(at::tensor({0.0f, 1.0f, 2.0f, 3.0f}));  // silu(0)*2, silu(1)*3
  EXPECT_FLOAT_EQ(y[0].item<float>(), 0.0f);
  EXPECT_NEAR(y[1].item<float>(), 3.0 / (1.0 + std::exp(-1.0)), 1e-6);
}

// select_backend() in a fresh process (the registry keeps a backend once made) with
// LOONGFORGE_DEVICE = args[0], LOONGFORGE_XPU_PLUGIN = args[1] ("-": unset); it must throw
// lf::Error containing args[2].
LF_WORKER_CASE(select_backend_fails) {
  const auto& a = worker_args();
  setenv("LOONGFORGE_DEVICE", a.at(0).c_str(), 1);
  if (a.at(1) == "-") unsetenv("LOONGFORGE_XPU_PLUGIN");
  else setenv("LOONGFORGE_XPU_PLUGIN", a.at(1).c_str(), 1);
  expect_error([] { backend::select_backend(); }, {a.at(2)});
}

void expect_select_fails(const std::string& device, const std::string& plugin,
                         const std::string& needle) {
  SpawnOptions opt;
  opt.world_size = 1;
  opt.args = {device, plugin, needle};
  expect_all_ok(run_workers("select_backend_fails", opt));
}

TEST(BackendSelection, XpuErrorsNameThePluginAndVersions) {
  expect_select_fails("xpu", "-", "LOONGFORGE_DEVICE=xpu but LOONGFORGE_XPU_PLUGIN is not set");
  expect_select_fails("xpu", "/nonexistent/libvendor_xpu.so",
                      "XPU plugin not found: LOONGFORGE_XPU_PLUGIN=/nonexistent/libvendor_xpu.so");
  expect_select_fails("xpu", lib("loongforge_xpu_test_abi_skew"), "XPU plugin ABI mismatch");
  expect_error([] { backend::load_xpu_plugin("/nonexistent/libvendor_xpu.so"); },
               {"XPU plugin not found", "/nonexistent/libvendor_xpu.so"});
  const auto skew = lib("loongforge_xpu_test_abi_skew");
  expect_error([&] { backend::load_xpu_plugin(skew); },
               {"ABI mismatch", skew,
                "implements ABI version " + std::to_string(LF_XPU_PLUGIN_ABI_VERSION + 1),
                "requires version " + std::to_string(LF_XPU_PLUGIN_ABI_VERSION)});
  const auto no_entry = lib("loongforge_xpu_test_no_entry");
  expect_error([&] { backend::load_xpu_plugin(no_entry); }, {no_entry, "lf_xpu_plugin_get"});
}

TEST(BackendSelection, XpuPluginErrorsBecomeLfErrors) {
  auto be = backend::load_xpu_plugin(lib("loongforge_xpu_reference"));
  // The shape check runs engine-side; a failure inside the plugin comes back through
  // last_error(): an out-of-range target reaches the plugin's reference check.
  expect_error([&] { be->ops().rms_norm_fwd(at::randn({2, 4}), at::randn({3}), 1e-6); },
               {"norm: x must be [.., h]"});
  expect_error([&] {
    be->ops().softmax_cross_entropy_fwd(at::randn({2, 4}), at::tensor({1, 9}, at::kLong), -100);
  }, {"XPU plugin 'loongforge-reference'", "softmax_cross_entropy_fwd", "outside [0, 4)"});
}

TEST(BackendSelection, CudaWithoutGpuIsAClearErrorAfterLoadingTheModule) {
  const std::string module = backend::cuda_module_path();
  if (!std::ifstream(module).good())
    GTEST_SKIP() << "the CUDA module was not built (LOONGFORGE_CUDA=OFF): " << module;
  ScopedEnv dev("LOONGFORGE_DEVICE", "cuda");
  if (backend::cuda_device_visible()) {
    const auto& be = backend::select_backend();
    EXPECT_EQ(be.name(), "cuda");
    EXPECT_TRUE(be.device().is_cuda());
    return;
  }
  // The module (and libtorch_cuda behind it) loads; the backend then refuses with the reason.
  expect_error([] { backend::select_backend(); },
               {"LOONGFORGE_DEVICE=cuda but no CUDA device is visible (CUDA_VISIBLE_DEVICES="});
  // Asking again repeats the error rather than returning a half-made backend.
  expect_error([] { backend::backend_by_name("cuda"); }, {"no CUDA device is visible"});
}

TEST(BackendSelection, MissingCudaModuleNamesThePath) {
  ScopedEnv path("LOONGFORGE_CUDA_MODULE", "/nonexistent/libloongforge_backend_cuda.so");
  expect_error([] { backend::load_cuda_backend(backend::cuda_module_path()); },
               {"CUDA backend module not found at /nonexistent/libloongforge_backend_cuda.so"});
}

// A process that only uses the CPU backend must not map libtorch_cuda (run in a fresh process,
// since other tests in this binary load the CUDA module).
LF_WORKER_CASE(cpu_process_maps_no_libtorch_cuda) {
  setenv("LOONGFORGE_DEVICE", "cpu", 1);
  const auto& be = backend::select_backend();
  auto y = be.ops().rms_norm_fwd(at::randn({2, 8}), at::ones({8}), 1e-6).y;
  ASSERT_EQ(y.numel(), 16);
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  EXPECT_EQ(text.str().find("libtorch_cuda"), std::string::npos);
}

TEST(BackendSelection, CpuProcessNeverLoadsLibtorchCuda) {
  SpawnOptions opt;
  opt.world_size = 1;
  expect_all_ok(run_workers("cpu_process_maps_no_libtorch_cuda", opt));
}

// ---- CPU backend services ------------------------------------------------------------------

TEST(CpuBackend, MemoryStatsCountTensorBytes) {
  const auto& be = backend::cpu_backend();
  be.reset_peak_memory();
  const auto before = be.memory_stats();
  ASSERT_TRUE(before.supported);
  {
    auto t = at::empty({1 << 20}, at::kFloat);  // 4 MiB
    const auto during = be.memory_stats();
    EXPECT_GE(during.allocated_bytes - before.allocated_bytes, 4 << 20);
    EXPECT_GE(during.peak_allocated_bytes, during.allocated_bytes);
    EXPECT_GT(during.num_allocations, before.num_allocations);
  }
  const auto after = be.memory_stats();
  EXPECT_LT(after.allocated_bytes - before.allocated_bytes, 4 << 20);  // freed
  EXPECT_GE(after.peak_allocated_bytes - before.allocated_bytes, 4 << 20);  // peak remembers
  be.reset_peak_memory();
  EXPECT_LT(be.memory_stats().peak_allocated_bytes - before.allocated_bytes, 4 << 20);
}

// The cache of large blocks: a freed 4 MiB block is kept (reserved, not allocated) and serves the
// next request of that size; a block whose keeping would take live + cached bytes above the
// highest live total so far is released instead.
LF_WORKER_CASE(cpu_cache_reuse_and_peak) {
  const auto& be = backend::cpu_backend();
  const auto before = be.memory_stats();
  void* first = nullptr;
  {
    auto t = at::empty({1 << 20}, at::kFloat);  // 4 MiB
    first = t.data_ptr();
  }
  const auto cached = be.memory_stats();
  EXPECT_EQ(cached.allocated_bytes, before.allocated_bytes);
  EXPECT_GE(cached.reserved_bytes - cached.allocated_bytes, (4 << 20) + (before.reserved_bytes - before.allocated_bytes));
  {
    auto again = at::empty({1 << 20}, at::kFloat);
    EXPECT_EQ(again.data_ptr(), first) << "the cached block serves the same size";
  }
  // 8 MiB more than anything live so far: a new peak. Allocating it fresh with the 4 MiB block
  // still cached would hold 4 + 8 MiB against a live peak of 8: the cache gives its blocks back
  // first, then keeps the 8 MiB block on free (live + cached = the peak).
  const int64_t live = be.memory_stats().allocated_bytes;
  { auto big = at::empty({int64_t{2} << 20}, at::kFloat); }
  const auto after = be.memory_stats();
  EXPECT_EQ(after.reserved_bytes - after.allocated_bytes, int64_t{8} << 20);
  EXPECT_EQ(after.peak_allocated_bytes, live + (int64_t{8} << 20));
  EXPECT_LE(after.reserved_bytes, after.peak_allocated_bytes) << "live + cached never above the live peak";
}

LF_WORKER_CASE(cpu_cache_gives_back_before_a_new_peak) {
  const auto& be = backend::cpu_backend();
  auto peak_reserved = [&] {
    const auto s = be.memory_stats();
    EXPECT_LE(s.reserved_bytes, std::max(s.peak_allocated_bytes, s.allocated_bytes));
  };
  std::vector<at::Tensor> small;
  for (int i = 0; i < 8; ++i) small.push_back(at::empty({int64_t{1} << 20}, at::kFloat));  // 8 x 4 MiB
  small.clear();  // 32 MiB cached (the live peak was 32 MiB higher)
  peak_reserved();
  auto big = at::empty({int64_t{12} << 20}, at::kFloat);  // 48 MiB: a new peak
  peak_reserved();
  EXPECT_EQ(be.memory_stats().reserved_bytes - be.memory_stats().allocated_bytes, 0) << "nothing may stay cached";
  big = at::Tensor();
  auto mid = at::empty({int64_t{6} << 20}, at::kFloat);  // 24 MiB under a cache of 48: within the peak
  peak_reserved();
}

LF_WORKER_CASE(cpu_cache_gives_back_the_smallest_covering_block) {
  const auto& be = backend::cpu_backend();
  void* big_ptr = nullptr;
  {
    auto big = at::empty({int64_t{10} << 20}, at::kFloat);   // 40 MiB
    auto small = at::empty({int64_t{1} << 20}, at::kFloat);  // 4 MiB, live at the same time: peak 44
    big_ptr = big.data_ptr();
  }
  const auto cached = [&] { return be.memory_stats().reserved_bytes - be.memory_stats().allocated_bytes; };
  EXPECT_EQ(cached(), int64_t{44} << 20);
  {
    // 1.5 MiB more than the cache leaves room for (and less than half of either cached block, so
    // neither serves it): the 4 MiB block covers that, the 40 MiB one stays.
    auto other = at::empty({int64_t{3} << 17}, at::kFloat);
    EXPECT_EQ(cached(), int64_t{40} << 20);
  }
  auto again = at::empty({int64_t{10} << 20}, at::kFloat);
  EXPECT_EQ(again.data_ptr(), big_ptr) << "the big block stayed cached and serves its size again";
}

// A request with no cached block of its capacity takes the smallest cached one up to twice its
// size (MoE's expert-parallel rows vary from step to step); the unused part counts as reserved.
// A request less than half the size of every cached block gets a fresh one.
LF_WORKER_CASE(cpu_cache_serves_a_smaller_request) {
  const auto& be = backend::cpu_backend();
  const auto held = [&] { return be.memory_stats().reserved_bytes - be.memory_stats().allocated_bytes; };
  const int64_t base = held();
  void* p = nullptr;
  {
    auto large = at::empty({int64_t{4} << 20}, at::kFloat);  // 16 MiB
    auto t = at::empty({int64_t{1} << 20}, at::kFloat);      // 4 MiB, live at the same time: peak 20
    p = t.data_ptr();
  }
  EXPECT_EQ(held(), base + (int64_t{20} << 20));
  {
    auto t = at::empty({int64_t{3} << 18}, at::kFloat);  // 3 MiB
    EXPECT_EQ(t.data_ptr(), p) << "the 4 MiB block serves 3 MiB";
    EXPECT_EQ(held(), base + (int64_t{17} << 20)) << "16 MiB cached, and the 4 MiB block's unused MiB";
  }
  EXPECT_EQ(held(), base + (int64_t{20} << 20)) << "back in the cache whole";
  {
    // 1.5 MiB: under half of either block, so a fresh one; 1.5 more than the peak leaves room for,
    // so the 4 MiB block is given back (nothing held as slack).
    auto t = at::empty({int64_t{3} << 17}, at::kFloat);
    EXPECT_EQ(held(), base + (int64_t{16} << 20));
  }
}

TEST(CpuBackend, ALargerCachedBlockServesASmallerRequest) {
  SpawnOptions opt;
  opt.world_size = 1;
  expect_all_ok(run_workers("cpu_cache_serves_a_smaller_request", opt));
}

// A request larger than every cached block (a new peak here) takes the largest cached mapped block
// and grows it in place of the kernel (mremap): its pages, and so its old contents, stay; a fresh
// mapping would read zeros.
LF_WORKER_CASE(cpu_cache_grows_a_smaller_block) {
  const auto& be = backend::cpu_backend();
  const auto held = [&] { return be.memory_stats().reserved_bytes - be.memory_stats().allocated_bytes; };
  const int64_t base = held();
  { auto t = at::full({int64_t{5} << 20}, 7.0, at::kFloat); }  // 20 MiB of 7s, then cached
  EXPECT_EQ(held(), base + (int64_t{20} << 20));
  auto grown = at::empty({int64_t{12} << 20}, at::kFloat);  // 48 MiB
  EXPECT_EQ(held(), base) << "it left the cache";
  EXPECT_TRUE(at::all(grown.narrow(0, 0, int64_t{5} << 20).eq(7.0)).item<bool>()) << "the 20 MiB block was grown";
}

TEST(CpuBackend, ALargerRequestGrowsACachedBlock) {
  SpawnOptions opt;
  opt.world_size = 1;
  expect_all_ok(run_workers("cpu_cache_grows_a_smaller_block", opt));
}

// Blocks from 64 KiB are cached (pi05's [448, 512] fp32 activations are 896 KiB: below the old 1
// MiB minimum they went to glibc, which unmapped or trimmed them, 823 page faults a step); smaller
// ones are not.
LF_WORKER_CASE(cpu_cache_holds_blocks_from_64_kib) {
  const auto& be = backend::cpu_backend();
  const auto cached = [&] { return be.memory_stats().reserved_bytes - be.memory_stats().allocated_bytes; };
  const int64_t base = cached();
  void* p = nullptr;
  {
    auto t = at::empty({int64_t{1} << 16}, at::kFloat);  // 256 KiB
    p = t.data_ptr();
  }
  EXPECT_EQ(cached() - base, int64_t{256} << 10);
  auto again = at::empty({int64_t{1} << 16}, at::kFloat);
  EXPECT_EQ(again.data_ptr(), p) << "the freed 256 KiB block serves the next request of its size";
  { auto small = at::empty({int64_t{1} << 13}, at::kFloat); }  // 32 KiB: glibc's
  EXPECT_EQ(cached(), base);
}

// Resident set size in bytes (/proc/self/statm's second field, in pages).
int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// Blocks of 1 MiB and more that the cache gives back leave the process. glibc would keep them:
// once a 30 MiB block has been freed its mmap threshold is above 2 MiB, so 2 MiB blocks come from
// its heap, and 32 MiB of them freed stay below its trim threshold (twice the mmap threshold).
LF_WORKER_CASE(cpu_cache_returns_large_blocks_to_the_system) {
  const auto& be = backend::cpu_backend();
  // Through a volatile pointer, so the compiler cannot drop the pair.
  void* volatile big = std::malloc(size_t{30} << 20);
  std::memset(big, 1, size_t{30} << 20);
  std::free(big);  // glibc's threshold rises, as it does in any long run
  const auto cached = [&] { return be.memory_stats().reserved_bytes - be.memory_stats().allocated_bytes; };
  const int64_t base = cached();
  {
    std::vector<at::Tensor> blocks;
    for (int i = 0; i < 16; ++i) blocks.push_back(at::ones({int64_t{1} << 19}, at::kFloat));  // 2 MiB each, touched
  }
  const int64_t with_blocks = resident_bytes();
  ASSERT_EQ(cached() - base, int64_t{32} << 20) << "the 16 freed blocks are cached";
  // A new peak: the cache is emptied before it is allocated (and it is not touched).
  auto peak = at::empty({int64_t{10} << 20}, at::kFloat);
  EXPECT_EQ(cached(), 0);
  EXPECT_GE(with_blocks - resident_bytes(), int64_t{28} << 20)
      << "the 32 MiB given back left the process: " << with_blocks << " -> " << resident_bytes() << " bytes resident";
}

TEST(CpuBackend, LargeBlocksTheCacheGivesBackLeaveTheProcess) {
  SpawnOptions opt;
  opt.world_size = 1;
  expect_all_ok(run_workers("cpu_cache_returns_large_blocks_to_the_system", opt));
}

TEST(CpuBackend, BlocksFrom64KiBAreCached) {
  SpawnOptions opt;
  opt.world_size = 1;
  expect_all_ok(run_workers("cpu_cache_holds_blocks_from_64_kib", opt));
}

// The cache's rules, each in a fresh process (what earlier tests of this binary left cached and
// the peak they reached would change the numbers): a freed block serves the next request of its
// size and never grows the peak; the cache gives blocks back before a fresh allocation would push
// live + cached above the highest live total (blocks of one size are not held while the peak is
// reached with another).
TEST(CpuBackend, LargeFreedBlocksAreReusedButNeverGrowThePeak) {
  SpawnOptions opt;
  opt.world_size = 1;
  expect_all_ok(run_workers("cpu_cache_reuse_and_peak", opt));
}

TEST(CpuBackend, CachedBlocksAreGivenBackBeforeTheyWouldRaiseThePeak) {
  SpawnOptions opt;
  opt.world_size = 1;
  expect_all_ok(run_workers("cpu_cache_gives_back_before_a_new_peak", opt));
}

TEST(CpuBackend, ASmallOvershootGivesBackASmallBlock) {
  SpawnOptions opt;
  opt.world_size = 1;
  expect_all_ok(run_workers("cpu_cache_gives_back_the_smallest_covering_block", opt));
}

// LOONGFORGE_CPU_ALLOCATOR_CACHE_MB in a fresh process (the allocator is made once): args[0] is
// the value; args[1] "reuse" / "no-reuse" (a freed 4 MiB block serves the next one, or not), or
// an error message the backend's creation must throw.
LF_WORKER_CASE(cpu_allocator_cache_env) {
  const auto& a = worker_args();
  setenv("LOONGFORGE_CPU_ALLOCATOR_CACHE_MB", a.at(0).c_str(), 1);
  if (a.at(1) != "reuse" && a.at(1) != "no-reuse") {
    expect_error([] { backend::cpu_backend(); }, {a.at(1)});
    return;
  }
  const auto& be = backend::cpu_backend();
  const auto before = be.memory_stats();
  { auto t = at::empty({1 << 20}, at::kFloat); }
  const auto after = be.memory_stats();
  const int64_t kept = (after.reserved_bytes - after.allocated_bytes) - (before.reserved_bytes - before.allocated_bytes);
  EXPECT_EQ(kept, a.at(1) == "reuse" ? (4 << 20) : 0);
}

TEST(CpuBackend, AllocatorCacheSettingIsObeyedOrRefused) {
  for (auto [value, want] : std::vector<std::pair<std::string, std::string>>{
           {"64", "reuse"}, {"0", "no-reuse"}, {"lots", "LOONGFORGE_CPU_ALLOCATOR_CACHE_MB='lots'"},
           {"-5", "is not a number of MiB >= 0"}}) {
    SpawnOptions opt;
    opt.world_size = 1;
    opt.args = {value, want};
    expect_all_ok(run_workers("cpu_allocator_cache_env", opt));
  }
}

// ATen kernels that allocate through raw_allocate (GELU's CPU kernel, for one) need the DataPtr's
// context to be its data pointer; the counting allocator must keep that contract.
TEST(CpuBackend, CountingAllocatorServesRawAllocateKernels) {
  const auto& be = lf::backend::cpu_backend();
  const auto before = be.memory_stats().allocated_bytes;
  auto x = at::randn({5, 3, 24});
  auto y = at::gelu(x);
  EXPECT_TRUE(at::allclose(y, x * 0.5 * (1 + at::erf(x * M_SQRT1_2)), 1e-6, 1e-6));
  void* raw = c10::GetCPUAllocator()->raw_allocate(1000);
  EXPECT_EQ(be.memory_stats().allocated_bytes - before, 2 * 5 * 3 * 24 * 4 + 1000);
  c10::GetCPUAllocator()->raw_deallocate(raw);
}

TEST(CpuBackend, RngStateRoundTripsAndSeedReproduces) {
  const auto& be = backend::cpu_backend();
  be.manual_seed(1234);
  auto a = at::randn({5});
  be.manual_seed(1234);
  EXPECT_TRUE(at::equal(a, at::randn({5})));
  const auto state = be.rng_state();
  EXPECT_FALSE(state.empty());
  auto b = at::randn({5});
  be.set_rng_state(state);
  EXPECT_TRUE(at::equal(b, at::randn({5})));
  EXPECT_FALSE(at::equal(a, b));
}

TEST(CpuBackend, EventsAndStreamsAreTrivialButCorrect) {
  const auto& be = backend::cpu_backend();
  auto start = be.create_event(true), end = be.create_event(true);
  start->record(be.current_stream());
  auto x = at::randn({256, 256});
  auto y = at::matmul(x, x);
  end->record(be.current_stream());
  EXPECT_TRUE(end->query());
  end->synchronize();
  EXPECT_GE(start->elapsed_ms(*end), 0.0);
  EXPECT_EQ(be.new_stream().device_type(), c10::DeviceType::CPU);
  EXPECT_THROW(be.set_device_index(1), lf::Error);
  be.synchronize();
}

}  // namespace
}  // namespace lf::testing
