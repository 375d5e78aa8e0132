/* Deliberately broken XPU plugins for the loader's error tests, one file compiled twice:
 *   LF_BAD_PLUGIN_ABI_SKEW=1: exports lf_xpu_plugin_get, reporting ABI version + 1;
 *   LF_BAD_PLUGIN_NO_ENTRY=1: exports no entry point at all. */
#include "loongforge/backend/xpu_plugin_abi.h"

#if defined(LF_BAD_PLUGIN_ABI_SKEW)
static lf_xpu_plugin table = {LF_XPU_PLUGIN_ABI_VERSION + 1u, sizeof(lf_xpu_plugin),
                              "skewed-test-plugin", "cpu"};

const lf_xpu_plugin* lf_xpu_plugin_get(uint32_t requested_abi) {
  (void)requested_abi;
  return &table;
}
#else
int lf_xpu_not_a_plugin(void) { return 0; }
#endif
