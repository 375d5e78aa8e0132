#include "loongforge/train/step_profiler.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <chrono>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <set>

#include "loongforge/core/error.h"

namespace lf::train {
namespace {

namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

bool is_gemm(const std::string& n) {
  static const std::set<std::string> gemms = {"aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm",
                                              "aten::addmv", "aten::mv", "aten::dot", "aten::_addmm_activation",
                                              "lf::gemm_onednn"};
  return gemms.count(n) > 0;
}

// The category a scope name stands for, or "" when it names none.
std::string scope_category(const std::string& n) {
  if (contains(n, "lf::optimizer")) return "optimizer (AdamW/SGD, clipping, grad norm)";
  if (contains(n, "lf::grad")) return "gradient buffer (accumulate, reduce, zero)";
  if (contains(n, "CrossEntropy") || contains(n, "cross_entropy")) return "cross entropy over the vocabulary";
  if (contains(n, "Sdpa") || contains(n, "sdpa") || contains(n, "attention")) return "attention";
  for (const char* k : {"RmsNorm", "rms_norm", "LayerNorm", "layer_norm", "Swiglu", "swiglu", "Rope", "rope", "Gelu", "gelu",
                        "ActivatedLinear", "activated_linear"})
    if (contains(n, k)) return "norms, activations, RoPE";
  return "";
}

struct Ev {
  std::string name;
  uint64_t start = 0, end = 0;
  double self_ms = 0;
  std::string scope;  // the nearest enclosing category scope
};

// Redirects file descriptor 2 to /dev/null for its lifetime.
class StderrMuted {
 public:
  StderrMuted() {
    std::fflush(stderr);
    saved_ = ::dup(2);
    const int null = ::open("/dev/null", O_WRONLY);
    if (saved_ >= 0 && null >= 0) ::dup2(null, 2);
    if (null >= 0) ::close(null);
  }
  ~StderrMuted() {
    std::fflush(stderr);
    if (saved_ >= 0) {
      ::dup2(saved_, 2);
      ::close(saved_);
    }
  }
  StderrMuted(const StderrMuted&) = delete;
  StderrMuted& operator=(const StderrMuted&) = delete;

 private:
  int saved_ = -1;
};

}  // namespace

StepProfiler::StepProfiler() = default;
StepProfiler::~StepProfiler() {
  if (running_) prof::disableProfiler();
}

void StepProfiler::start() {
  LF_CHECK(!running_, "the step profiler is already running");
  ProfilerConfig config(ProfilerState::KINETO);
  const std::set<ActivityType> activities{ActivityType::CPU};
  {
    // This wheel's Kineto is built with CUDA and prints "ERROR: gpuGetDeviceCount failed" on a
    // machine without a GPU while it sets up or collects, although only CPU activities are asked
    // for. These calls write nothing else worth reading; failures still throw (and are reported).
    StderrMuted muted;
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
  }
  running_ = true;
  start_ms_ = now_ms();
}

ProfileReport StepProfiler::stop(int64_t steps, const std::string& trace_path) {
  LF_CHECK(running_, "the step profiler is not running");
  std::unique_ptr<prof::ProfilerResult> result;
  {
    StderrMuted muted;  // see start()
    result = prof::disableProfiler();
  }
  running_ = false;
  ProfileReport r;
  r.steps = steps;
  r.wall_ms = now_ms() - start_ms_;
  if (!trace_path.empty()) result->save(trace_path);

  // Self times: per thread, events in start order; a stack of the enclosing ones.
  std::map<uint64_t, std::vector<Ev>> by_thread;
  for (const auto& e : result->events()) {
    if (e.deviceType() != c10::DeviceType::CPU || e.endNs() <= e.startNs()) continue;
    by_thread[e.startThreadId()].push_back({e.name(), e.startNs(), e.endNs(), 0, ""});
  }
  std::map<std::string, ProfileRow> cats, ops;
  double covered_main = 0;
  size_t most = 0;
  for (auto& [tid, evs] : by_thread) most = std::max(most, evs.size());
  for (auto& [tid, evs] : by_thread) {
    std::sort(evs.begin(), evs.end(), [](const Ev& a, const Ev& b) {
      return a.start != b.start ? a.start < b.start : a.end > b.end;
    });
    std::vector<Ev*> stack;
    double top_level = 0;
    for (auto& e : evs) {
      while (!stack.empty() && stack.back()->end <= e.start) stack.pop_back();
      const double dur = static_cast<double>(e.end - e.start) / 1e6;
      e.self_ms += dur;
      if (!stack.empty()) {
        stack.back()->self_ms -= dur;
        e.scope = stack.back()->scope;
      } else {
        top_level += dur;
      }
      const std::string own = scope_category(e.name);
      if (!own.empty()) e.scope = own;
      stack.push_back(&e);
    }
    if (evs.size() == most) covered_main = top_level;  // the training thread has the most events
    for (const auto& e : evs) {
      std::string cat;
      if (is_gemm(e.name))
        cat = e.scope == "cross entropy over the vocabulary" ? "GEMM: output layer" : "GEMM: layers";
      else if (contains(e.name, "flash_attention") || contains(e.name, "scaled_dot_product"))
        cat = "attention";
      else if (!e.scope.empty())
        cat = e.scope;
      else if (e.name.rfind("aten::empty", 0) == 0)
        cat = "tensor allocation (aten::empty*)";
      else
        cat = "other ATen ops (element-wise, copies, autograd)";
      auto& c = cats[cat];
      c.name = cat;
      c.ms += e.self_ms;
      ++c.calls;
      auto& o = ops[e.name];
      o.name = e.name;
      o.ms += e.self_ms;
      ++o.calls;
    }
  }
  auto& outside = cats["outside any op (trainer code, autograd engine)"];
  outside.name = "outside any op (trainer code, autograd engine)";
  outside.ms = std::max(0.0, r.wall_ms - covered_main);
  for (auto& [k, v] : cats) r.categories.push_back(v);
  for (auto& [k, v] : ops) r.top_ops.push_back(v);
  auto by_ms = [](const ProfileRow& a, const ProfileRow& b) { return a.ms > b.ms; };
  std::sort(r.categories.begin(), r.categories.end(), by_ms);
  std::sort(r.top_ops.begin(), r.top_ops.end(), by_ms);
  if (r.top_ops.size() > 15) r.top_ops.resize(15);
  return r;
}

std::vector<std::string> ProfileReport::lines() const {
  std::vector<std::string> out;
  char buf[256];
  std::snprintf(buf, sizeof buf, "profile | %lld step(s), %.1f ms per step (self time of each op, by category)",
                static_cast<long long>(steps), wall_ms / static_cast<double>(std::max<int64_t>(1, steps)));
  out.emplace_back(buf);
  const double per = 1.0 / static_cast<double>(std::max<int64_t>(1, steps));
  for (const auto& c : categories) {
    std::snprintf(buf, sizeof buf, "profile | %-48s %9.1f ms/step %6.1f%%", c.name.c_str(), c.ms * per,
                  wall_ms > 0 ? 100.0 * c.ms / wall_ms : 0.0);
    out.emplace_back(buf);
  }
  out.emplace_back("profile | top ops by self time:");
  for (const auto& o : top_ops) {
    std::snprintf(buf, sizeof buf, "profile |   %-46s %9.1f ms/step %7lld calls/step", o.name.c_str(), o.ms * per,
                  static_cast<long long>(static_cast<double>(o.calls) * per));
    out.emplace_back(buf);
  }
  return out;
}

}  // namespace lf::train
