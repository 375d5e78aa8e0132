// LoongForge gloo shim (see ../README.md): the abstract rendezvous store interface that c10d's
// inline GlooStore adapter overrides. Only the declarations GlooStore needs; the object is built
// inside libtorch_cpu.so with gloo's own definition.
#pragma once
#include <chrono>
#include <string>
#include <vector>

namespace gloo::rendezvous {
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys,
                    const std::chrono::milliseconds& timeout) = 0;
};
}  // namespace gloo::rendezvous
