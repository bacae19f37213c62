// Which activity kinds are collected.
#pragma once

namespace simcupti {

// cuptiFinalize: stop collecting every kind.
void disable_all_activity();

}  // namespace simcupti
