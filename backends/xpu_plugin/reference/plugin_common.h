// Internals shared by the reference XPU plugin's translation units: turning ABI views into
// ATen tensors over the same memory, and the error discipline of the C ABI (no exception
// crosses it: each entry point catches, stores the message for last_error(), returns a status).
// Not part of the ABI and not used by the engine.
#pragma once

#include <ATen/Functions.h>

#include <cstring>
#include <exception>
#include <string>

#include "loongforge/backend/xpu_tensor_view.h"

namespace lf::xpu_reference {

// The message last_error() returns on this thread.
std::string& last_error_slot();

// A tensor over the view's memory (no copy); the view must be host memory.
inline at::Tensor from_view(const lf_xpu_tensor* v) {
  if (v == nullptr) return at::Tensor();
  return at::from_blob(v->data, backend::xpu::shape_of(*v),
                       c10::IntArrayRef(v->strides, static_cast<size_t>(v->ndim)),
                       at::TensorOptions().dtype(backend::xpu::scalar_type(v->dtype)));
}

// Thrown inside the plugin to return a status other than LF_XPU_ERROR.
struct StatusError : std::exception {
  int status;
  std::string message;
  StatusError(int s, std::string m) : status(s), message(std::move(m)) {}
  const char* what() const noexcept override { return message.c_str(); }
};

// Runs f, mapping exceptions to statuses and last_error().
template <class F>
int guarded(F&& f) noexcept {
  try {
    f();
    last_error_slot().clear();
    return LF_XPU_OK;
  } catch (const StatusError& e) {
    last_error_slot() = e.message;
    return e.status;
  } catch (const std::exception& e) {
    last_error_slot() = e.what();
    return LF_XPU_ERROR;
  } catch (...) {
    last_error_slot() = "unknown exception";
    return LF_XPU_ERROR;
  }
}

}  // namespace lf::xpu_reference

// Communicator entry points (store_communicator.cpp), gathered into the table by
// reference_plugin.cpp.
extern "C" {
int lf_xpu_ref_comm_create(const lf_xpu_comm_config* config, lf_xpu_comm** out);
int lf_xpu_ref_comm_destroy(lf_xpu_comm* comm);
int lf_xpu_ref_all_reduce(lf_xpu_comm* comm, lf_xpu_tensor* tensor, int32_t op);
int lf_xpu_ref_all_gather(lf_xpu_comm* comm, lf_xpu_tensor* output, const lf_xpu_tensor* input);
int lf_xpu_ref_reduce_scatter(lf_xpu_comm* comm, lf_xpu_tensor* output,
                              const lf_xpu_tensor* input, int32_t op);
int lf_xpu_ref_broadcast(lf_xpu_comm* comm, lf_xpu_tensor* tensor, int32_t root);
int lf_xpu_ref_all_to_all(lf_xpu_comm* comm, lf_xpu_tensor* output, const lf_xpu_tensor* input,
                          const int64_t* output_splits, const int64_t* input_splits);
int lf_xpu_ref_send(lf_xpu_comm* comm, const lf_xpu_tensor* tensor, int32_t dst, int32_t tag);
int lf_xpu_ref_recv(lf_xpu_comm* comm, lf_xpu_tensor* tensor, int32_t src, int32_t tag);
int lf_xpu_ref_barrier(lf_xpu_comm* comm);
}
