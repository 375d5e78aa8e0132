// OpenPI's websocket policy protocol (openpi_client.websocket_client_policy and
// openpi.serving.websocket_policy_server), the message codec: every message is one binary
// websocket frame holding one msgpack value, numpy arrays encoded as openpi_client.msgpack_numpy
// does: a map {b"__ndarray__": true, b"data": <bin: the array's bytes, C order>, b"dtype": <str:
// numpy's dtype.str, e.g. "<f4", "|u1">, b"shape": [dims]} (keys msgpack bin, as Python bytes
// pack), and numpy scalars {b"__npgeneric__": true, b"data": <value>, b"dtype": <str>}.
//   server -> client, on connect: the policy's metadata (a map);
//   client -> server: an observation (a map: arrays, "prompt", nested maps);
//   server -> client: the reply {"actions": float32 [H, action_dim], "policy_timing": {"infer_ms"},
//     "server_timing": {"infer_ms", "prev_total_ms" (from the second reply)}};
//   on an error: one text frame (the error), then a close with code 1011.
// The server and the C++ client (loongforge-eval --server) are docs/vla.md's subject.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "loongforge/vla/policy.h"

namespace lf::vla::openpi {

// A msgpack message (a map) to an Observation: ndarrays and numpy scalars become tensors (their
// dtype and shape; "<f4" float32, "|u1" uint8, "<f8", "<f2", "|i1", "<i2", "<i4", "<i8", "|b1"),
// plain numbers 0-d tensors (float64, int64, bool), lists of numbers 1-d tensors, nested maps
// their entries under "<key>/<entry>", "prompt" (a string) the prompt; other strings and nil are
// ignored. An lf::Error naming the key and what is wrong: not msgpack, trailing bytes, not a map,
// an unknown dtype, data whose size does not match dtype and shape, a non-string prompt.
Observation decode_observation(const std::string& message);
// The other direction (the C++ client): arrays as ndarrays, the prompt under "prompt" (when set).
std::string encode_observation(const Observation& obs);

// A JSON value as msgpack (objects as maps with str keys, arrays, strings, numbers, bools, null).
std::string encode_json(const nlohmann::json& value);
// A msgpack message as JSON (ndarrays as {"dtype", "shape"} summaries); an lf::Error when it is
// not msgpack.
nlohmann::json decode_json(const std::string& message);

// The reply to an observation: {"actions": <ndarray float32>} plus the entries of `extra` (a JSON
// object, e.g. the timings).
std::string encode_reply(const at::Tensor& actions, const nlohmann::json& extra);
struct Reply {
  at::Tensor actions;  // float32 [H, action_dim]
  nlohmann::json rest;  // the other entries (timings)
};
Reply decode_reply(const std::string& message);

}  // namespace lf::vla::openpi
