// cuptiFinalize may be called from inside an API callback (its header example
// does so at CUPTI_API_EXIT), so it only resets this library's state: the
// hooks stay installed in the driver and simply find nothing to deliver to.

#include <cupti.h>

#include "activity.h"
#include "buffers.h"
#include "callbacks.h"

CUptiResult cuptiFinalize(void) {
  simcupti::drop_subscriber();
  simcupti::disable_all_activity();
  // The header leaves flushing to the client before it detaches; buffers
  // still held are handed back anyway so the client can free them.
  simcupti::release_buffers();
  return CUPTI_SUCCESS;
}
