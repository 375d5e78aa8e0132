// OmegaConf-style interpolation, resolved once after composition and overrides:
// `${a.b.c}` (absolute key), `${oc.env:VAR}` and `${oc.env:VAR,default}`; `\${` is a literal
// `${`. A value that is exactly one interpolation takes the referenced value with its type (a
// map, a sequence, an unquoted number); inside a longer string the referenced scalar is
// stringified. Not lazy: the tree holds no interpolations afterwards.
#pragma once

#include "loongforge/core/config/config_error.h"
#include "loongforge/core/config/node.h"

namespace lf::config {

// Resolves every interpolation in `tree` in place. A missing key, a missing environment variable
// without a default, a reference to a non-scalar inside a string, a syntax error or a cycle is
// added to `errors`, naming the referencing value's key and origin.
void resolve_interpolations(Node& tree, ErrorList& errors);

}  // namespace lf::config
