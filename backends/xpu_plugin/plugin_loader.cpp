// The XPU plugin loader: dlopens the library named by LOONGFORGE_XPU_PLUGIN, checks its C ABI
// version, and adapts its function table to DeviceBackend, OpTable and Communicator. Output
// tensors are allocated here (the engine owns memory) and filled by the plugin. Part of
// loongforge::backend; the plugin itself is out of tree (reference/ is the in-tree example).
#include <dlfcn.h>

#include <ATen/Functions.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <filesystem>

#include "loongforge/backend/reference_ops.h"
#include "loongforge/backend/registry.h"
#include "loongforge/backend/xpu_tensor_view.h"

namespace lf::backend {
namespace {

using xpu::to_view;

// The loaded library and its table; shared by the backend, its op table and communicators.
struct Plugin {
  std::string path;
  const lf_xpu_plugin* table = nullptr;

  // Turns a failed status into an lf::Error naming the call, the plugin and its message.
  void check(int status, const char* call) const {
    if (status == LF_XPU_OK) return;
    const char* msg = table->last_error ? table->last_error() : nullptr;
    LF_FAIL("XPU plugin '", table->name, "' (", path, ") failed in ", call, " with status ",
            status, (status == LF_XPU_UNSUPPORTED ? " (unsupported)" : ""),
            (status == LF_XPU_TIMEOUT ? " (timeout)" : ""), ": ", (msg && *msg ? msg : "(no message)"),
            lf::hint(status == LF_XPU_UNSUPPORTED
                         ? "the plugin does not implement this op or dtype"
                         : "see the plugin's message; LOONGFORGE_DEVICE=cpu runs the reference"));
  }
};

at::ScalarType stat_type(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Inputs go to the plugin contiguous (ABI v1 promises only that); the returned tensor keeps
// the memory alive for the call.
at::Tensor in(const at::Tensor& t) { return t.defined() ? t.contiguous() : t; }

class PluginOps final : public OpTable {
 public:
  explicit PluginOps(std::shared_ptr<const Plugin> p) : p_(std::move(p)) {}

  RmsNormFwd rms_norm_fwd(const at::Tensor& x0, const at::Tensor& w0, double eps) const override {
    check_rms_norm_args(x0, w0);
    auto x = in(x0), w = in(w0);
    RmsNormFwd r{at::empty_like(x), at::empty(x.sizes().slice(0, x.dim() - 1),
                                              x.options().dtype(stat_type(x)))};
    auto vx = to_view(x), vw = to_view(w), vy = to_view(r.y), vr = to_view(r.rstd);
    p_->check(t().rms_norm_fwd(&vx, &vw, eps, &vy, &vr), "rms_norm_fwd");
    return r;
  }
  RmsNormBwd rms_norm_bwd(const at::Tensor& dy0, const at::Tensor& x0, const at::Tensor& w0,
                          const at::Tensor& rstd0) const override {
    check_rms_norm_args(x0, w0);
    auto dy = in(dy0), x = in(x0), w = in(w0), rstd = in(rstd0);
    RmsNormBwd r{at::empty_like(x), at::empty_like(w)};
    auto vdy = to_view(dy), vx = to_view(x), vw = to_view(w), vr = to_view(rstd);
    auto vdx = to_view(r.dx), vdw = to_view(r.dw);
    p_->check(t().rms_norm_bwd(&vdy, &vx, &vw, &vr, &vdx, &vdw), "rms_norm_bwd");
    return r;
  }

  LayerNormFwd layer_norm_fwd(const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& b0,
                              double eps) const override {
    check_rms_norm_args(x0, w0);
    auto x = in(x0), w = in(w0), b = in(b0);
    auto stat_opts = x.options().dtype(stat_type(x));
    auto rows = x.sizes().slice(0, x.dim() - 1);
    LayerNormFwd r{at::empty_like(x), at::empty(rows, stat_opts), at::empty(rows, stat_opts)};
    auto vx = to_view(x), vw = to_view(w), vy = to_view(r.y), vm = to_view(r.mean),
         vr = to_view(r.rstd);
    lf_xpu_tensor vb{};
    if (b.defined()) vb = to_view(b);
    p_->check(t().layer_norm_fwd(&vx, &vw, b.defined() ? &vb : nullptr, eps, &vy, &vm, &vr),
              "layer_norm_fwd");
    return r;
  }
  LayerNormBwd layer_norm_bwd(const at::Tensor& dy0, const at::Tensor& x0, const at::Tensor& w0,
                              bool has_bias, const at::Tensor& mean0,
                              const at::Tensor& rstd0) const override {
    check_rms_norm_args(x0, w0);
    auto dy = in(dy0), x = in(x0), w = in(w0), mean = in(mean0), rstd = in(rstd0);
    LayerNormBwd r{at::empty_like(x), at::empty_like(w), has_bias ? at::empty_like(w) : at::Tensor()};
    auto vdy = to_view(dy), vx = to_view(x), vw = to_view(w), vm = to_view(mean),
         vr = to_view(rstd), vdx = to_view(r.dx), vdw = to_view(r.dw);
    lf_xpu_tensor vdb{};
    if (has_bias) vdb = to_view(r.db);
    p_->check(t().layer_norm_bwd(&vdy, &vx, &vw, &vm, &vr, &vdx, &vdw, has_bias ? &vdb : nullptr),
              "layer_norm_bwd");
    return r;
  }

  at::Tensor rope_fwd(const at::Tensor& x0, const at::Tensor& cos0, const at::Tensor& sin0,
                      bool interleaved) const override {
    return rope_call(x0, cos0, sin0, interleaved, t().rope_fwd, "rope_fwd");
  }
  at::Tensor rope_bwd(const at::Tensor& dy0, const at::Tensor& cos0, const at::Tensor& sin0,
                      bool interleaved) const override {
    return rope_call(dy0, cos0, sin0, interleaved, t().rope_bwd, "rope_bwd");
  }

  at::Tensor swiglu_fwd(const at::Tensor& gu0) const override {
    check_swiglu_args(gu0);
    auto gu = in(gu0);
    auto shape = gu.sizes().vec();
    shape.back() /= 2;
    auto y = at::empty(shape, gu.options());
    auto vg = to_view(gu), vy = to_view(y);
    p_->check(t().swiglu_fwd(&vg, &vy), "swiglu_fwd");
    return y;
  }
  at::Tensor swiglu_bwd(const at::Tensor& dy0, const at::Tensor& gu0) const override {
    check_swiglu_args(gu0);
    auto dy = in(dy0), gu = in(gu0);
    auto dgu = at::empty_like(gu);
    auto vdy = to_view(dy), vg = to_view(gu), vd = to_view(dgu);
    p_->check(t().swiglu_bwd(&vdy, &vg, &vd), "swiglu_bwd");
    return dgu;
  }

  at::Tensor gelu_fwd(const at::Tensor& x0) const override {
    auto x = in(x0);
    auto y = at::empty_like(x);
    auto vx = to_view(x), vy = to_view(y);
    p_->check(t().gelu_fwd(&vx, &vy), "gelu_fwd");
    return y;
  }
  at::Tensor gelu_bwd(const at::Tensor& dy0, const at::Tensor& x0) const override {
    LF_CHECK(dy0.sizes() == x0.sizes(), "gelu_bwd: dy and x must have the same shape");
    auto dy = in(dy0), x = in(x0);
    auto dx = at::empty_like(x);
    auto vdy = to_view(dy), vx = to_view(x), vd = to_view(dx);
    p_->check(t().gelu_bwd(&vdy, &vx, &vd), "gelu_bwd");
    return dx;
  }

  CrossEntropyFwd softmax_cross_entropy_fwd(const at::Tensor& logits0, const at::Tensor& target0,
                                            int64_t ignore_index) const override {
    check_cross_entropy_args(logits0, target0);
    auto logits = in(logits0), target = in(target0);
    auto opts = logits.options().dtype(stat_type(logits));
    CrossEntropyFwd r{at::empty({logits.size(0)}, opts), at::empty({logits.size(0)}, opts)};
    auto vl = to_view(logits), vt = to_view(target), vloss = to_view(r.loss),
         vlse = to_view(r.lse);
    p_->check(t().softmax_cross_entropy_fwd(&vl, &vt, ignore_index, &vloss, &vlse),
              "softmax_cross_entropy_fwd");
    return r;
  }
  at::Tensor softmax_cross_entropy_bwd(const at::Tensor& dloss0, const at::Tensor& logits0,
                                       const at::Tensor& target0, const at::Tensor& lse0,
                                       int64_t ignore_index) const override {
    check_cross_entropy_args(logits0, target0);
    auto dloss = in(dloss0), logits = in(logits0), target = in(target0), lse = in(lse0);
    auto dlogits = at::empty_like(logits);
    auto vd = to_view(dloss), vl = to_view(logits), vt = to_view(target), vlse = to_view(lse),
         vout = to_view(dlogits);
    p_->check(t().softmax_cross_entropy_bwd(&vd, &vl, &vt, &vlse, ignore_index, &vout),
              "softmax_cross_entropy_bwd");
    return dlogits;
  }

  SdpaFwd sdpa_fwd(const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0,
                   const AttentionMask& mask, double scale) const override {
    check_sdpa_args(q0, k0, v0, mask);
    auto q = in(q0), k = in(k0), v = in(v0), m = in(mask.mask);
    SdpaFwd r{at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options()),
              at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(stat_type(q)))};
    auto vq = to_view(q), vk = to_view(k), vv = to_view(v), vo = to_view(r.o),
         vlse = to_view(r.lse);
    lf_xpu_tensor vm{};
    if (m.defined()) vm = to_view(m);
    p_->check(t().sdpa_fwd(&vq, &vk, &vv, static_cast<int32_t>(mask.kind),
                           m.defined() ? &vm : nullptr, scale, &vo, &vlse),
              "sdpa_fwd");
    return r;
  }
  SdpaBwd sdpa_bwd(const at::Tensor& dout0, const at::Tensor& q0, const at::Tensor& k0,
                   const at::Tensor& v0, const at::Tensor& o0, const at::Tensor& lse0,
                   const AttentionMask& mask, double scale) const override {
    check_sdpa_args(q0, k0, v0, mask);
    auto dout = in(dout0), q = in(q0), k = in(k0), v = in(v0), o = in(o0), lse = in(lse0),
         m = in(mask.mask);
    SdpaBwd r{at::empty_like(q), at::empty_like(k), at::empty_like(v)};
    auto vdo = to_view(dout), vq = to_view(q), vk = to_view(k), vv = to_view(v),
         vo = to_view(o), vlse = to_view(lse), vdq = to_view(r.dq), vdk = to_view(r.dk),
         vdv = to_view(r.dv);
    lf_xpu_tensor vm{};
    if (m.defined()) vm = to_view(m);
    p_->check(t().sdpa_bwd(&vdo, &vq, &vk, &vv, &vo, &vlse, static_cast<int32_t>(mask.kind),
                           m.defined() ? &vm : nullptr, scale, &vdq, &vdk, &vdv),
              "sdpa_bwd");
    return r;
  }

  void adamw_step(at::TensorList params, at::TensorList grads, at::TensorList exp_avg,
                  at::TensorList exp_avg_sq, const AdamWHyper& h) const override {
    LF_CHECK(grads.size() == params.size() && exp_avg.size() == params.size() &&
                 exp_avg_sq.size() == params.size(),
             "adamw_step: list lengths differ: params ", params.size(), ", grads ", grads.size(),
             ", exp_avg ", exp_avg.size(), ", exp_avg_sq ", exp_avg_sq.size());
    std::vector<at::Tensor> keep;  // contiguous grads kept alive through the call
    std::vector<lf_xpu_tensor> vp, vg, vm, vv;
    for (size_t i = 0; i < params.size(); ++i) {
      // In-place states must be updated where they live, so they must be contiguous already.
      for (const at::Tensor* s : {&params[i], &exp_avg[i], &exp_avg_sq[i]})
        LF_CHECK(s->is_contiguous(), "adamw_step on the XPU plugin: tensor ", i,
                 " is not contiguous", lf::hint("optimizer states must be contiguous buffers"));
      // The ABI's hyper-parameters have no gradient scale: apply it here.
      keep.push_back(h.grad_scale != 1.0 ? (grads[i] * h.grad_scale).contiguous() : grads[i].contiguous());
      vp.push_back(to_view(params[i]));
      vg.push_back(to_view(keep.back()));
      vm.push_back(to_view(exp_avg[i]));
      vv.push_back(to_view(exp_avg_sq[i]));
    }
    lf_xpu_adamw_hyper hyper{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.step};
    p_->check(t().adamw_step(vp.data(), vg.data(), vm.data(), vv.data(), params.size(), &hyper),
              "adamw_step");
  }

  // Not in the plugin ABI (v2): the reference math on the plugin's tensors (GEMMs and
  // element-wise ATen ops wherever the model's own linear layers run).
  LinearCrossEntropyFwd linear_cross_entropy(const at::Tensor& x, const at::Tensor& w, const at::Tensor& target,
                                             const at::Tensor& weight, int64_t ignore_index,
                                             const VocabShard& shard, int64_t chunk_tokens,
                                             const GradInto& into = {}) const override {
    return ref_.linear_cross_entropy(x, w, target, weight, ignore_index, shard, chunk_tokens, into);
  }
  at::Tensor squared_norm(at::TensorList tensors) const override { return ref_.squared_norm(tensors); }
  at::Tensor gelu_tanh_fwd(const at::Tensor& x) const override { return ref_.gelu_tanh_fwd(x); }
  at::Tensor gelu_tanh_bwd(const at::Tensor& dy, const at::Tensor& x) const override {
    return ref_.gelu_tanh_bwd(dy, x);
  }
  at::Tensor geglu_tanh_fwd(const at::Tensor& gate, const at::Tensor& up) const override {
    return ref_.geglu_tanh_fwd(gate, up);
  }
  GatedBwd geglu_tanh_bwd(const at::Tensor& dy, const at::Tensor& gate, const at::Tensor& up) const override {
    return ref_.geglu_tanh_bwd(dy, gate, up);
  }
  MoePermuteFwd moe_permute_fwd(const at::Tensor& x, const at::Tensor& indices, int64_t e) const override {
    return ref_.moe_permute_fwd(x, indices, e);
  }
  at::Tensor moe_permute_bwd(const at::Tensor& d, const at::Tensor& source, int64_t n) const override {
    return ref_.moe_permute_bwd(d, source, n);
  }
  at::Tensor moe_unpermute_fwd(const at::Tensor& y, const at::Tensor& pos, const at::Tensor& p) const override {
    return ref_.moe_unpermute_fwd(y, pos, p);
  }
  MoeUnpermuteBwd moe_unpermute_bwd(const at::Tensor& d, const at::Tensor& y, const at::Tensor& pos,
                                    const at::Tensor& p) const override {
    return ref_.moe_unpermute_bwd(d, y, pos, p);
  }
  at::Tensor grouped_gemm_fwd(const at::Tensor& x, const at::Tensor& w, const at::Tensor& c) const override {
    return ref_.grouped_gemm_fwd(x, w, c);
  }
  GroupedGemmBwd grouped_gemm_bwd(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                                  const at::Tensor& c, GemmGrads want) const override {
    return ref_.grouped_gemm_bwd(dy, x, w, c, want);
  }
  at::Tensor dsa_indexer_topk(const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& w, double scale,
                              int64_t topk) const override {
    return ref_.dsa_indexer_topk(qi, ki, w, scale, topk);
  }
  at::Tensor dsa_indexer_scores_fwd(const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& w,
                                    const at::Tensor& idx, double scale) const override {
    return ref_.dsa_indexer_scores_fwd(qi, ki, w, idx, scale);
  }
  DsaIndexerBwd dsa_indexer_scores_bwd(const at::Tensor& d, const at::Tensor& qi, const at::Tensor& ki,
                                       const at::Tensor& w, const at::Tensor& idx, double scale) const override {
    return ref_.dsa_indexer_scores_bwd(d, qi, ki, w, idx, scale);
  }
  DsaAttentionFwd dsa_sparse_attention_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const at::Tensor& idx, double scale) const override {
    return ref_.dsa_sparse_attention_fwd(q, k, v, idx, scale);
  }
  DsaAttentionBwd dsa_sparse_attention_bwd(const at::Tensor& d, const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const at::Tensor& idx, const at::Tensor& o,
                                           const at::Tensor& lse, double scale) const override {
    return ref_.dsa_sparse_attention_bwd(d, q, k, v, idx, o, lse, scale);
  }

 private:
  ReferenceOps ref_;
  const lf_xpu_plugin& t() const { return *p_->table; }

  using RopeFnPtr = int (*)(const lf_xpu_tensor*, const lf_xpu_tensor*, const lf_xpu_tensor*,
                            int32_t, lf_xpu_tensor*);
  at::Tensor rope_call(const at::Tensor& x0, const at::Tensor& cos0, const at::Tensor& sin0,
                       bool interleaved, RopeFnPtr fn, const char* what) const {
    check_rope_args(x0, cos0, sin0);
    auto x = in(x0), cos = in(cos0), sin = in(sin0);
    auto y = at::empty_like(x);
    auto vx = to_view(x), vc = to_view(cos), vs = to_view(sin), vy = to_view(y);
    p_->check(fn(&vx, &vc, &vs, interleaved ? 1 : 0, &vy), what);
    return y;
  }

  std::shared_ptr<const Plugin> p_;
};

// ---- communicator --------------------------------------------------------------------------

class DoneWork final : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

// The c10d store behind the ABI's callbacks. Exceptions must not cross into the plugin: each
// callback catches, keeps the message for the error the loader will raise, and returns 1.
struct StoreBridge {
  c10::intrusive_ptr<c10d::Store> store;
  std::string last_error;

  template <class F>
  static int guard(void* user, F&& f) {
    auto* self = static_cast<StoreBridge*>(user);
    try {
      f(*self);
      return 0;
    } catch (const std::exception& e) {
      self->last_error = e.what();
      return 1;
    }
  }
  static int set(void* user, const char* key, const void* data, size_t size) {
    return guard(user, [&](StoreBridge& s) {
      auto* b = static_cast<const uint8_t*>(data);
      s.store->set(key, std::vector<uint8_t>(b, b + size));
    });
  }
  static int get(void* user, const char* key, void (*sink)(void*, const void*, size_t),
                 void* ctx) {
    return guard(user, [&](StoreBridge& s) {
      auto v = s.store->get(key);
      sink(ctx, v.data(), v.size());
    });
  }
  static int wait(void* user, const char* const* keys, size_t n, int64_t timeout_ms) {
    return guard(user, [&](StoreBridge& s) {
      s.store->wait(std::vector<std::string>(keys, keys + n), std::chrono::milliseconds(timeout_ms));
    });
  }
  static int add(void* user, const char* key, int64_t delta, int64_t* result) {
    return guard(user, [&](StoreBridge& s) { *result = s.store->add(key, delta); });
  }
  static int delete_key(void* user, const char* key) {
    return guard(user, [&](StoreBridge& s) { s.store->deleteKey(key); });
  }
};

class PluginCommunicator final : public Communicator {
 public:
  PluginCommunicator(std::shared_ptr<const Plugin> p, const CommunicatorSpec& spec)
      : p_(std::move(p)), name_(spec.name), ranks_(spec.ranks), rank_(spec.group_rank) {
    LF_CHECK(spec.store, "XPU communicator for group '", spec.name, "' needs a store");
    bridge_->store = spec.store;
    lf_xpu_comm_config cfg{};
    cfg.rank = spec.group_rank;
    cfg.size = static_cast<int32_t>(spec.ranks.size());
    cfg.global_rank = spec.global_rank;
    cfg.group_name = name_.c_str();
    cfg.timeout_ms = spec.timeout.count();
    cfg.store = {bridge_.get(), &StoreBridge::set, &StoreBridge::get, &StoreBridge::wait,
                 &StoreBridge::add, &StoreBridge::delete_key};
    check(p_->table->comm_create(&cfg, &comm_), "comm_create");
  }
  ~PluginCommunicator() override {
    if (comm_ != nullptr) p_->table->comm_destroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  const std::string& name() const override { return name_; }
  const std::vector<int>& ranks() const override { return ranks_; }

  // The plugin's calls block; async work is therefore complete on return.
  std::shared_ptr<Work> all_reduce(at::Tensor& t, ReduceOp op, bool) override {
    require_contiguous(t, "all_reduce");
    auto v = to_view(t);
    check(p_->table->all_reduce(comm_, &v, code(op)), "all_reduce");
    return done();
  }
  std::shared_ptr<Work> all_gather(at::Tensor& out, const at::Tensor& input, bool) override {
    require_contiguous(out, "all_gather");
    // In place (input inside out, as ZeRO-1 gathers fp32 parameters): hand the plugin a copy.
    const bool aliases = input.has_storage() && out.has_storage() && input.storage().is_alias_of(out.storage());
    auto i = aliases ? input.clone() : input.contiguous();
    auto vo = to_view(out), vi = to_view(i);
    check(p_->table->all_gather(comm_, &vo, &vi), "all_gather");
    return done();
  }
  std::shared_ptr<Work> reduce_scatter(at::Tensor& out, const at::Tensor& input, ReduceOp op,
                                       bool) override {
    require_contiguous(out, "reduce_scatter");
    auto i = input.contiguous();
    auto vo = to_view(out), vi = to_view(i);
    check(p_->table->reduce_scatter(comm_, &vo, &vi, code(op)), "reduce_scatter");
    return done();
  }
  std::shared_ptr<Work> broadcast(at::Tensor& t, int root, bool) override {
    require_contiguous(t, "broadcast");
    auto v = to_view(t);
    check(p_->table->broadcast(comm_, &v, root), "broadcast");
    return done();
  }
  std::shared_ptr<Work> all_to_all(at::Tensor& out, const at::Tensor& input,
                                   const std::vector<int64_t>& out_splits,
                                   const std::vector<int64_t>& in_splits, bool) override {
    require_contiguous(out, "all_to_all");
    for (const auto* s : {&out_splits, &in_splits})
      LF_CHECK(s->empty() || static_cast<int>(s->size()) == size(), "all_to_all on group '",
               name_, "': a split list has ", s->size(), " entries for ", size(), " members");
    auto i = input.contiguous();
    auto vo = to_view(out), vi = to_view(i);
    check(p_->table->all_to_all(comm_, &vo, &vi, out_splits.empty() ? nullptr : out_splits.data(),
                                in_splits.empty() ? nullptr : in_splits.data()),
          "all_to_all");
    return done();
  }
  std::shared_ptr<Work> send(const at::Tensor& t, int dst, int tag, bool) override {
    auto c = t.contiguous();
    auto v = to_view(c);
    check(p_->table->send(comm_, &v, dst, tag), "send");
    return done();
  }
  std::shared_ptr<Work> recv(at::Tensor& t, int src, int tag, bool) override {
    require_contiguous(t, "recv");
    auto v = to_view(t);
    check(p_->table->recv(comm_, &v, src, tag), "recv");
    return done();
  }
  void barrier() override { check(p_->table->barrier(comm_), "barrier"); }

 private:
  static int32_t code(ReduceOp op) {
    switch (op) {
      case ReduceOp::sum: return LF_XPU_SUM;
      case ReduceOp::avg: return LF_XPU_AVG;
      case ReduceOp::max: return LF_XPU_MAX;
      case ReduceOp::min: return LF_XPU_MIN;
      case ReduceOp::product: return LF_XPU_PRODUCT;
    }
    return LF_XPU_SUM;
  }
  void require_contiguous(const at::Tensor& t, const char* op) const {
    LF_CHECK(t.is_contiguous(), op, " on group '", name_, "': the output tensor must be contiguous",
             lf::hint("collectives write in place; pass a contiguous buffer"));
  }
  void check(int status, const char* op) {
    if (status == LF_XPU_OK) return;
    std::string store_error = std::move(bridge_->last_error);
    bridge_->last_error.clear();
    try {
      p_->check(status, op);
    } catch (const lf::Error& e) {
      LF_FAIL(op, " on group '", name_, "' (ranks ", c10::IntArrayRef(std::vector<int64_t>(
                                                          ranks_.begin(), ranks_.end())),
              ", index ", rank_, "): ", e.message(),
              (store_error.empty() ? "" : "; store: "), store_error, lf::hint(e.hint()));
    }
  }
  static std::shared_ptr<Work> done() { return std::make_shared<DoneWork>(); }

  std::shared_ptr<const Plugin> p_;
  std::string name_;
  std::vector<int> ranks_;
  int rank_;
  std::unique_ptr<StoreBridge> bridge_ = std::make_unique<StoreBridge>();
  lf_xpu_comm* comm_ = nullptr;
};

// ---- backend -------------------------------------------------------------------------------

// Events on a host-memory plugin: record() synchronizes the device, so a recorded event is
// complete; timing reads the host clock.
class PluginEvent final : public Event {
 public:
  explicit PluginEvent(std::shared_ptr<const Plugin> p) : p_(std::move(p)) {}
  void record(const c10::Stream&) override {
    p_->check(p_->table->synchronize(0), "synchronize");
    at_ = std::chrono::steady_clock::now();
  }
  bool query() const override { return true; }
  void synchronize() const override {}
  double elapsed_ms(const Event& end) const override {
    auto* e = dynamic_cast<const PluginEvent*>(&end);
    LF_CHECK(e != nullptr, "elapsed_ms: the end event is not an XPU plugin event");
    return std::chrono::duration<double, std::milli>(e->at_ - at_).count();
  }

 private:
  std::shared_ptr<const Plugin> p_;
  std::chrono::steady_clock::time_point at_{};
};

class PluginBackend final : public DeviceBackend {
 public:
  explicit PluginBackend(std::shared_ptr<const Plugin> p) : p_(p), ops_(p) {}

  const std::string& name() const override { return name_; }
  c10::Device device() const override { return c10::Device(c10::DeviceType::CPU); }
  bool is_available() const override { return device_count() > 0; }
  int device_count() const override {
    int32_t n = 0;
    p_->check(p_->table->device_count(&n), "device_count");
    return n;
  }
  void set_device_index(int index) const override {
    LF_CHECK(index == 0, "the XPU plugin path supports device index 0 only (ABI v1); asked for ",
             index);
  }
  MemoryStats memory_stats() const override {
    lf_xpu_memory_stats s{};
    p_->check(p_->table->memory_stats(0, &s), "memory_stats");
    return {s.supported != 0, s.allocated_bytes, s.peak_allocated_bytes, s.reserved_bytes,
            s.num_allocations};
  }
  void reset_peak_memory() const override {
    p_->check(p_->table->reset_peak_memory(0), "reset_peak_memory");
  }
  void synchronize() const override { p_->check(p_->table->synchronize(0), "synchronize"); }
  c10::Stream current_stream() const override {
    return c10::Stream(c10::Stream::DEFAULT, device());
  }
  c10::Stream new_stream() const override { return current_stream(); }
  void set_current_stream(const c10::Stream&) const override {}
  void stream_wait_event(const c10::Stream&, const Event&) const override {}
  std::unique_ptr<Event> create_event(bool) const override {
    return std::make_unique<PluginEvent>(p_);
  }
  void manual_seed(uint64_t seed) const override {
    p_->check(p_->table->manual_seed(seed), "manual_seed");
  }
  std::vector<uint8_t> rng_state() const override {
    size_t n = 0;
    p_->check(p_->table->get_rng_state(nullptr, &n), "get_rng_state");
    std::vector<uint8_t> state(n);
    p_->check(p_->table->get_rng_state(state.data(), &n), "get_rng_state");
    state.resize(n);
    return state;
  }
  void set_rng_state(const std::vector<uint8_t>& state) const override {
    p_->check(p_->table->set_rng_state(state.data(), state.size()), "set_rng_state");
  }
  std::unique_ptr<Communicator> create_communicator(const CommunicatorSpec& spec) const override {
    return std::make_unique<PluginCommunicator>(p_, spec);
  }
  const OpTable& ops() const override { return ops_; }

 private:
  std::string name_ = "xpu";
  std::shared_ptr<const Plugin> p_;
  PluginOps ops_;
};

}  // namespace

std::unique_ptr<DeviceBackend> load_xpu_plugin(const std::string& path) {
  std::error_code ec;
  LF_CHECK(std::filesystem::exists(path, ec), "XPU plugin not found: LOONGFORGE_XPU_PLUGIN=",
           path,
           lf::hint("point LOONGFORGE_XPU_PLUGIN at the vendor plugin .so (the CPU reference "
                    "plugin is build/lib/libloongforge_xpu_reference.so)"));
  // Never closed: the backend and the tensors' deleters may live until exit.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    LF_FAIL("cannot load the XPU plugin ", path, ": ", why ? why : "?",
            lf::hint("the plugin or one of its dependencies failed to load; see the message"));
  }
  auto get = reinterpret_cast<lf_xpu_plugin_get_fn>(dlsym(handle, LF_XPU_PLUGIN_ENTRY_SYMBOL));
  LF_CHECK(get != nullptr, "XPU plugin ", path, " does not export ", LF_XPU_PLUGIN_ENTRY_SYMBOL,
           lf::hint("a plugin must define extern \"C\" lf_xpu_plugin_get (backend/xpu_plugin_abi.h)"));
  const lf_xpu_plugin* table = get(LF_XPU_PLUGIN_ABI_VERSION);
  LF_CHECK(table != nullptr, "XPU plugin ", path, " returned no function table for ABI version ",
           LF_XPU_PLUGIN_ABI_VERSION, lf::hint("the plugin does not support this LoongForge's ABI"));
  LF_CHECK(table->abi_version == LF_XPU_PLUGIN_ABI_VERSION && 
               table->struct_size == sizeof(lf_xpu_plugin),
           "XPU plugin ABI mismatch: ", path, " implements ABI version ", table->abi_version,
           " (table of ", table->struct_size, " bytes) but this LoongForge requires version ",
           LF_XPU_PLUGIN_ABI_VERSION, " (", sizeof(lf_xpu_plugin), " bytes)",
           lf::hint("use a plugin built against this LoongForge's xpu_plugin_abi.h"));
  const std::string kind = table->memory_kind ? table->memory_kind : "";
  LF_CHECK(kind == "cpu", "XPU plugin ", path, " reports memory kind '", kind,
           "'; ABI version ", LF_XPU_PLUGIN_ABI_VERSION, " supports host memory ('cpu') only");
  auto plugin = std::make_shared<Plugin>();
  plugin->path = path;
  plugin->table = table;
  return std::make_unique<PluginBackend>(std::move(plugin));
}

}  // namespace lf::backend
