// LoongForge gloo shim (see ../README.md): devices and unbound buffers are only held through
// smart pointers.
#pragma once
namespace gloo::transport {
class Device;
class UnboundBuffer;
}  // namespace gloo::transport
