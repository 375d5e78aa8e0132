// The reference XPU plugin (libloongforge_xpu_reference.so): implements the whole C ABI on the
// CPU by calling the reference op math through ATen, so LOONGFORGE_DEVICE=xpu is tested end to
// end (loader, views, output allocation, error statuses) without an XPU. Its communicator is in
// store_communicator.cpp. Not fast; a template for vendors, not a product.
#include "loongforge/backend/reference_ops.h"
#include "loongforge/backend/registry.h"
#include "plugin_common.h"

namespace lf::xpu_reference {

std::string& last_error_slot() {
  thread_local std::string message;
  return message;
}

namespace {

using backend::AttentionMask;
using backend::MaskKind;

const backend::ReferenceOps& ops() {
  static const backend::ReferenceOps instance;
  return instance;
}
// The engine allocates this plugin's tensors in host memory, so host statistics and the host
// generator are the device's.
const backend::DeviceBackend& host() { return backend::cpu_backend(); }

at::Tensor T(const lf_xpu_tensor* v) { return from_view(v); }

AttentionMask mask_of(int32_t kind, const lf_xpu_tensor* mask) {
  if (kind < LF_XPU_MASK_NONE || kind > LF_XPU_MASK_ADDITIVE)
    throw StatusError(LF_XPU_UNSUPPORTED, "unknown mask kind " + std::to_string(kind));
  return {static_cast<MaskKind>(kind), T(mask)};
}

extern "C" {

const char* ref_last_error(void) { return last_error_slot().c_str(); }

int ref_device_count(int32_t* count) {
  return guarded([&] { *count = 1; });
}
int ref_synchronize(int32_t) { return LF_XPU_OK; }
int ref_memory_stats(int32_t, lf_xpu_memory_stats* out) {
  return guarded([&] {
    auto s = host().memory_stats();
    *out = {s.supported ? 1 : 0, s.allocated_bytes, s.peak_allocated_bytes, s.reserved_bytes,
            s.num_allocations};
  });
}
int ref_reset_peak_memory(int32_t) {
  return guarded([&] { host().reset_peak_memory(); });
}
int ref_manual_seed(uint64_t seed) {
  return guarded([&] { host().manual_seed(seed); });
}
int ref_get_rng_state(void* state, size_t* size) {
  return guarded([&] {
    auto s = host().rng_state();
    if (state != nullptr) {
      if (*size < s.size()) throw StatusError(LF_XPU_ERROR, "rng state buffer too small");
      std::memcpy(state, s.data(), s.size());
    }
    *size = s.size();
  });
}
int ref_set_rng_state(const void* state, size_t size) {
  return guarded([&] {
    auto* b = static_cast<const uint8_t*>(state);
    host().set_rng_state(std::vector<uint8_t>(b, b + size));
  });
}

int ref_rms_norm_fwd(const lf_xpu_tensor* x, const lf_xpu_tensor* w, double eps,
                     lf_xpu_tensor* y, lf_xpu_tensor* rstd) {
  return guarded([&] {
    auto r = ops().rms_norm_fwd(T(x), T(w), eps);
    T(y).copy_(r.y);
    T(rstd).copy_(r.rstd);
  });
}
int ref_rms_norm_bwd(const lf_xpu_tensor* dy, const lf_xpu_tensor* x, const lf_xpu_tensor* w,
                     const lf_xpu_tensor* rstd, lf_xpu_tensor* dx, lf_xpu_tensor* dw) {
  return guarded([&] {
    auto r = ops().rms_norm_bwd(T(dy), T(x), T(w), T(rstd));
    T(dx).copy_(r.dx);
    T(dw).copy_(r.dw);
  });
}
int ref_layer_norm_fwd(const lf_xpu_tensor* x, const lf_xpu_tensor* w, const lf_xpu_tensor* b,
                       double eps, lf_xpu_tensor* y, lf_xpu_tensor* mean, lf_xpu_tensor* rstd) {
  return guarded([&] {
    auto r = ops().layer_norm_fwd(T(x), T(w), T(b), eps);
    T(y).copy_(r.y);
    T(mean).copy_(r.mean);
    T(rstd).copy_(r.rstd);
  });
}
int ref_layer_norm_bwd(const lf_xpu_tensor* dy, const lf_xpu_tensor* x, const lf_xpu_tensor* w,
                       const lf_xpu_tensor* mean, const lf_xpu_tensor* rstd, lf_xpu_tensor* dx,
                       lf_xpu_tensor* dw, lf_xpu_tensor* db) {
  return guarded([&] {
    auto r = ops().layer_norm_bwd(T(dy), T(x), T(w), db != nullptr, T(mean), T(rstd));
    T(dx).copy_(r.dx);
    T(dw).copy_(r.dw);
    if (db != nullptr) T(db).copy_(r.db);
  });
}
int ref_rope_fwd(const lf_xpu_tensor* x, const lf_xpu_tensor* cos, const lf_xpu_tensor* sin,
                 int32_t interleaved, lf_xpu_tensor* y) {
  return guarded([&] { T(y).copy_(ops().rope_fwd(T(x), T(cos), T(sin), interleaved != 0)); });
}
int ref_rope_bwd(const lf_xpu_tensor* dy, const lf_xpu_tensor* cos, const lf_xpu_tensor* sin,
                 int32_t interleaved, lf_xpu_tensor* dx) {
  return guarded([&] { T(dx).copy_(ops().rope_bwd(T(dy), T(cos), T(sin), interleaved != 0)); });
}
int ref_swiglu_fwd(const lf_xpu_tensor* gate_up, lf_xpu_tensor* y) {
  return guarded([&] { T(y).copy_(ops().swiglu_fwd(T(gate_up))); });
}
int ref_swiglu_bwd(const lf_xpu_tensor* dy, const lf_xpu_tensor* gate_up, lf_xpu_tensor* dgu) {
  return guarded([&] { T(dgu).copy_(ops().swiglu_bwd(T(dy), T(gate_up))); });
}
int ref_gelu_fwd(const lf_xpu_tensor* x, lf_xpu_tensor* y) {
  return guarded([&] { T(y).copy_(ops().gelu_fwd(T(x))); });
}
int ref_gelu_bwd(const lf_xpu_tensor* dy, const lf_xpu_tensor* x, lf_xpu_tensor* dx) {
  return guarded([&] { T(dx).copy_(ops().gelu_bwd(T(dy), T(x))); });
}
int ref_ce_fwd(const lf_xpu_tensor* logits, const lf_xpu_tensor* target, int64_t ignore_index,
               lf_xpu_tensor* loss, lf_xpu_tensor* lse) {
  return guarded([&] {
    auto r = ops().softmax_cross_entropy_fwd(T(logits), T(target), ignore_index);
    T(loss).copy_(r.loss);
    T(lse).copy_(r.lse);
  });
}
int ref_ce_bwd(const lf_xpu_tensor* dloss, const lf_xpu_tensor* logits,
               const lf_xpu_tensor* target, const lf_xpu_tensor* lse, int64_t ignore_index,
               lf_xpu_tensor* dlogits) {
  return guarded([&] {
    T(dlogits).copy_(
        ops().softmax_cross_entropy_bwd(T(dloss), T(logits), T(target), T(lse), ignore_index));
  });
}
int ref_sdpa_fwd(const lf_xpu_tensor* q, const lf_xpu_tensor* k, const lf_xpu_tensor* v,
                 int32_t mask_kind, const lf_xpu_tensor* mask, double scale, lf_xpu_tensor* o,
                 lf_xpu_tensor* lse) {
  return guarded([&] {
    auto r = ops().sdpa_fwd(T(q), T(k), T(v), mask_of(mask_kind, mask), scale);
    T(o).copy_(r.o);
    T(lse).copy_(r.lse);
  });
}
int ref_sdpa_bwd(const lf_xpu_tensor* dout, const lf_xpu_tensor* q, const lf_xpu_tensor* k,
                 const lf_xpu_tensor* v, const lf_xpu_tensor* o, const lf_xpu_tensor* lse,
                 int32_t mask_kind, const lf_xpu_tensor* mask, double scale, lf_xpu_tensor* dq,
                 lf_xpu_tensor* dk, lf_xpu_tensor* dv) {
  return guarded([&] {
    auto r = ops().sdpa_bwd(T(dout), T(q), T(k), T(v), T(o), T(lse), mask_of(mask_kind, mask),
                            scale);
    T(dq).copy_(r.dq);
    T(dk).copy_(r.dk);
    T(dv).copy_(r.dv);
  });
}
int ref_adamw_step(lf_xpu_tensor* params, const lf_xpu_tensor* grads, lf_xpu_tensor* exp_avg,
                   lf_xpu_tensor* exp_avg_sq, size_t count, const lf_xpu_adamw_hyper* h) {
  return guarded([&] {
    std::vector<at::Tensor> p, g, m, v;
    for (size_t i = 0; i < count; ++i) {
      p.push_back(T(&params[i]));
      g.push_back(T(&grads[i]));
      m.push_back(T(&exp_avg[i]));
      v.push_back(T(&exp_avg_sq[i]));
    }
    ops().adamw_step(p, g, m, v,
                     {h->lr, h->beta1, h->beta2, h->eps, h->weight_decay, h->step});
  });
}

}  // extern "C"

const lf_xpu_plugin kTable = {
    LF_XPU_PLUGIN_ABI_VERSION,
    sizeof(lf_xpu_plugin),
    "loongforge-reference",
    "cpu",
    &ref_last_error,
    &ref_device_count,
    &ref_synchronize,
    &ref_memory_stats,
    &ref_reset_peak_memory,
    &ref_manual_seed,
    &ref_get_rng_state,
    &ref_set_rng_state,
    &ref_rms_norm_fwd,
    &ref_rms_norm_bwd,
    &ref_layer_norm_fwd,
    &ref_layer_norm_bwd,
    &ref_rope_fwd,
    &ref_rope_bwd,
    &ref_swiglu_fwd,
    &ref_swiglu_bwd,
    &ref_gelu_fwd,
    &ref_gelu_bwd,
    &ref_ce_fwd,
    &ref_ce_bwd,
    &ref_sdpa_fwd,
    &ref_sdpa_bwd,
    &ref_adamw_step,
    &lf_xpu_ref_comm_create,
    &lf_xpu_ref_comm_destroy,
    &lf_xpu_ref_all_reduce,
    &lf_xpu_ref_all_gather,
    &lf_xpu_ref_reduce_scatter,
    &lf_xpu_ref_broadcast,
    &lf_xpu_ref_all_to_all,
    &lf_xpu_ref_send,
    &lf_xpu_ref_recv,
    &lf_xpu_ref_barrier,
};

}  // namespace
}  // namespace lf::xpu_reference

extern "C" __attribute__((visibility("default"))) const lf_xpu_plugin* lf_xpu_plugin_get(
    uint32_t requested_abi) {
  // One version only: return it whatever was asked, and let the loader report a mismatch.
  (void)requested_abi;
  return &lf::xpu_reference::kTable;
}
