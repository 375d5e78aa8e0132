// LoongForge gloo shim (see ../README.md): c10d's header uses no name from this file.
#pragma once
