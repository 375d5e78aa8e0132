// Registration of the built-in component and composite types (Registry::builtin()). Internal.
#pragma once

namespace lf::models {
class Registry;
void register_builtin_types(Registry& r);
}  // namespace lf::models
