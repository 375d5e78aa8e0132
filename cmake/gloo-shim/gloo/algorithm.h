// LoongForge gloo shim (see README.md): nothing from gloo/algorithm.h is used by c10d's header.
#pragma once
#include "gloo/context.h"
