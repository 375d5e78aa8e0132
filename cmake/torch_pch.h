// The precompiled header of LibTorch-facing targets: the narrow ATen headers nearly every such
// TU includes. Never torch/torch.h.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <c10/core/ScalarType.h>
#include <c10/util/intrusive_ptr.h>
#include <string>
#include <vector>
#include <memory>
