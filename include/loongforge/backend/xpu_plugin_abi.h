/* The XPU plugin C ABI: what an out-of-tree shared library exports so LoongForge can run on a
 * device it was not built for (LOONGFORGE_DEVICE=xpu, LOONGFORGE_XPU_PLUGIN=path). Pure C, no
 * LibTorch types. Not the loader (backends/xpu_plugin) and not a tensor library: the engine
 * owns every tensor and passes views; the plugin computes into caller-allocated outputs.
 *
 * Versioning: LF_XPU_PLUGIN_ABI_VERSION changes whenever anything in this file changes meaning
 * or layout (no "compatible additions": one number, exact match). The loader calls
 * lf_xpu_plugin_get(LF_XPU_PLUGIN_ABI_VERSION); a plugin returns the table for that version if
 * it supports it, otherwise its own newest table (or NULL), and the loader refuses any table
 * whose abi_version differs, naming both versions and the file.
 *
 * Conventions: every function returns an lf_xpu_status; on failure last_error() describes it
 * (thread-local in the plugin, valid until the next call on that thread). Tensor math follows
 * backend/op_table.h exactly (shapes, dtypes, mask alignment, fp32 statistics). */
#ifndef LOONGFORGE_BACKEND_XPU_PLUGIN_ABI_H_
#define LOONGFORGE_BACKEND_XPU_PLUGIN_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LF_XPU_PLUGIN_ABI_VERSION 2u /* 2: gelu_fwd / gelu_bwd */
#define LF_XPU_PLUGIN_ENTRY_SYMBOL "lf_xpu_plugin_get"
#define LF_XPU_MAX_DIMS 8

typedef enum lf_xpu_status {
  LF_XPU_OK = 0,
  LF_XPU_ERROR = 1,        /* see last_error() */
  LF_XPU_UNSUPPORTED = 2,  /* the plugin does not implement this op/dtype */
  LF_XPU_TIMEOUT = 3,      /* a communicator or store wait ran past its timeout */
} lf_xpu_status;

typedef enum lf_xpu_dtype {
  LF_XPU_FLOAT32 = 0,
  LF_XPU_FLOAT64 = 1,
  LF_XPU_BFLOAT16 = 2,
  LF_XPU_FLOAT16 = 3,
  LF_XPU_INT64 = 4,
  LF_XPU_INT32 = 5,
  LF_XPU_UINT8 = 6,
  LF_XPU_BOOL = 7,
  LF_XPU_INT8 = 8,
} lf_xpu_dtype;

/* A strided view of device memory (strides in elements). The engine passes contiguous views
 * today; a plugin must still honour strides or return LF_XPU_UNSUPPORTED. An optional tensor
 * argument is passed as NULL. */
typedef struct lf_xpu_tensor {
  void* data;
  int32_t dtype; /* lf_xpu_dtype */
  int32_t ndim;
  int64_t shape[LF_XPU_MAX_DIMS];
  int64_t strides[LF_XPU_MAX_DIMS];
  int32_t device_index;
} lf_xpu_tensor;

typedef enum lf_xpu_mask_kind {
  LF_XPU_MASK_NONE = 0,
  LF_XPU_MASK_CAUSAL = 1,   /* bottom-right aligned */
  LF_XPU_MASK_BOOL = 2,     /* mask: bool [b|1, nq|1, s, t], true = attend */
  LF_XPU_MASK_ADDITIVE = 3, /* mask: float [b|1, nq|1, s, t] */
} lf_xpu_mask_kind;

typedef enum lf_xpu_reduce_op {
  LF_XPU_SUM = 0, LF_XPU_AVG = 1, LF_XPU_MAX = 2, LF_XPU_MIN = 3, LF_XPU_PRODUCT = 4,
} lf_xpu_reduce_op;

typedef struct lf_xpu_memory_stats {
  int32_t supported;
  int64_t allocated_bytes, peak_allocated_bytes, reserved_bytes, num_allocations;
} lf_xpu_memory_stats;

typedef struct lf_xpu_adamw_hyper {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;
} lf_xpu_adamw_hyper;

/* The rendezvous store the engine lends a communicator (a c10d store, already prefixed for the
 * group). Callbacks return 0 on success, non-zero on failure or timeout. */
typedef struct lf_xpu_store {
  void* user;
  int (*set)(void* user, const char* key, const void* data, size_t size);
  /* Blocks until key exists (store timeout), then calls sink(sink_ctx, data, size) once. */
  int (*get)(void* user, const char* key, void (*sink)(void* sink_ctx, const void* data,
                                                       size_t size), void* sink_ctx);
  int (*wait)(void* user, const char* const* keys, size_t num_keys, int64_t timeout_ms);
  /* Atomically adds delta to the integer stored at key (0 if absent); *result = new value. */
  int (*add)(void* user, const char* key, int64_t delta, int64_t* result);
  /* May be NULL; lets a plugin drop keys it no longer needs. */
  int (*delete_key)(void* user, const char* key);
} lf_xpu_store;

typedef struct lf_xpu_comm_config {
  int32_t rank;          /* index in the group */
  int32_t size;
  int32_t global_rank;
  const char* group_name;
  int64_t timeout_ms;
  lf_xpu_store store;    /* valid until destroy */
} lf_xpu_comm_config;

typedef struct lf_xpu_comm lf_xpu_comm; /* opaque, owned by the plugin */

typedef struct lf_xpu_plugin {
  uint32_t abi_version;  /* LF_XPU_PLUGIN_ABI_VERSION the table was built for */
  uint32_t struct_size;  /* sizeof(lf_xpu_plugin) in the plugin's build */
  const char* name;      /* e.g. "kunlunxin-p800", "loongforge-reference" */
  /* Where tensors for this device live, as the engine allocates them: "cpu" (host memory) is the
   * only kind this ABI version supports; a device-memory plugin needs a later version. */
  const char* memory_kind;
  const char* (*last_error)(void);

  /* device */
  int (*device_count)(int32_t* count);
  int (*synchronize)(int32_t device_index);
  int (*memory_stats)(int32_t device_index, lf_xpu_memory_stats* out);
  int (*reset_peak_memory)(int32_t device_index);
  int (*manual_seed)(uint64_t seed);
  /* state == NULL: *size receives the byte count; else copies up to *size bytes. */
  int (*get_rng_state)(void* state, size_t* size);
  int (*set_rng_state)(const void* state, size_t size);

  /* ops: see backend/op_table.h for the math and shapes; outputs are written in place */
  int (*rms_norm_fwd)(const lf_xpu_tensor* x, const lf_xpu_tensor* w, double eps,
                      lf_xpu_tensor* y, lf_xpu_tensor* rstd);
  int (*rms_norm_bwd)(const lf_xpu_tensor* dy, const lf_xpu_tensor* x, const lf_xpu_tensor* w,
                      const lf_xpu_tensor* rstd, lf_xpu_tensor* dx, lf_xpu_tensor* dw);
  int (*layer_norm_fwd)(const lf_xpu_tensor* x, const lf_xpu_tensor* w,
                        const lf_xpu_tensor* b /* nullable */, double eps, lf_xpu_tensor* y,
                        lf_xpu_tensor* mean, lf_xpu_tensor* rstd);
  int (*layer_norm_bwd)(const lf_xpu_tensor* dy, const lf_xpu_tensor* x, const lf_xpu_tensor* w,
                        const lf_xpu_tensor* mean, const lf_xpu_tensor* rstd, lf_xpu_tensor* dx,
                        lf_xpu_tensor* dw, lf_xpu_tensor* db /* nullable: no bias */);
  int (*rope_fwd)(const lf_xpu_tensor* x, const lf_xpu_tensor* cos, const lf_xpu_tensor* sin,
                  int32_t interleaved, lf_xpu_tensor* y);
  int (*rope_bwd)(const lf_xpu_tensor* dy, const lf_xpu_tensor* cos, const lf_xpu_tensor* sin,
                  int32_t interleaved, lf_xpu_tensor* dx);
  int (*swiglu_fwd)(const lf_xpu_tensor* gate_up, lf_xpu_tensor* y);
  int (*swiglu_bwd)(const lf_xpu_tensor* dy, const lf_xpu_tensor* gate_up,
                    lf_xpu_tensor* dgate_up);
  int (*gelu_fwd)(const lf_xpu_tensor* x, lf_xpu_tensor* y);
  int (*gelu_bwd)(const lf_xpu_tensor* dy, const lf_xpu_tensor* x, lf_xpu_tensor* dx);
  int (*softmax_cross_entropy_fwd)(const lf_xpu_tensor* logits, const lf_xpu_tensor* target,
                                   int64_t ignore_index, lf_xpu_tensor* loss, lf_xpu_tensor* lse);
  int (*softmax_cross_entropy_bwd)(const lf_xpu_tensor* dloss, const lf_xpu_tensor* logits,
                                   const lf_xpu_tensor* target, const lf_xpu_tensor* lse,
                                   int64_t ignore_index, lf_xpu_tensor* dlogits);
  int (*sdpa_fwd)(const lf_xpu_tensor* q, const lf_xpu_tensor* k, const lf_xpu_tensor* v,
                  int32_t mask_kind, const lf_xpu_tensor* mask /* nullable */, double scale,
                  lf_xpu_tensor* o, lf_xpu_tensor* lse);
  int (*sdpa_bwd)(const lf_xpu_tensor* dout, const lf_xpu_tensor* q, const lf_xpu_tensor* k,
                  const lf_xpu_tensor* v, const lf_xpu_tensor* o, const lf_xpu_tensor* lse,
                  int32_t mask_kind, const lf_xpu_tensor* mask /* nullable */, double scale,
                  lf_xpu_tensor* dq, lf_xpu_tensor* dk, lf_xpu_tensor* dv);
  /* In place on params, exp_avg, exp_avg_sq (arrays of count views). */
  int (*adamw_step)(lf_xpu_tensor* params, const lf_xpu_tensor* grads, lf_xpu_tensor* exp_avg,
                    lf_xpu_tensor* exp_avg_sq, size_t count, const lf_xpu_adamw_hyper* hyper);

  /* communicator: blocking calls; ranks are group ranks; semantics of backend/communicator.h
   * (all_gather/reduce_scatter/all_to_all along dim 0; splits in rows, NULL = equal). */
  int (*comm_create)(const lf_xpu_comm_config* config, lf_xpu_comm** out);
  int (*comm_destroy)(lf_xpu_comm* comm);
  int (*all_reduce)(lf_xpu_comm* comm, lf_xpu_tensor* tensor, int32_t op);
  int (*all_gather)(lf_xpu_comm* comm, lf_xpu_tensor* output, const lf_xpu_tensor* input);
  int (*reduce_scatter)(lf_xpu_comm* comm, lf_xpu_tensor* output, const lf_xpu_tensor* input,
                        int32_t op);
  int (*broadcast)(lf_xpu_comm* comm, lf_xpu_tensor* tensor, int32_t root);
  int (*all_to_all)(lf_xpu_comm* comm, lf_xpu_tensor* output, const lf_xpu_tensor* input,
                    const int64_t* output_splits, const int64_t* input_splits);
  int (*send)(lf_xpu_comm* comm, const lf_xpu_tensor* tensor, int32_t dst, int32_t tag);
  int (*recv)(lf_xpu_comm* comm, lf_xpu_tensor* tensor, int32_t src, int32_t tag);
  int (*barrier)(lf_xpu_comm* comm);
} lf_xpu_plugin;

/* The one exported symbol. */
typedef const lf_xpu_plugin* (*lf_xpu_plugin_get_fn)(uint32_t requested_abi);
const lf_xpu_plugin* lf_xpu_plugin_get(uint32_t requested_abi);

#ifdef __cplusplus
}
#endif

#endif /* LOONGFORGE_BACKEND_XPU_PLUGIN_ABI_H_ */
