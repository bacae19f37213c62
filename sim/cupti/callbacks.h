// The callback API: one subscriber, per-(domain, cbid) enable bits, and the
// driver's API hook that delivers enabled driver-domain callbacks.
#pragma once

namespace simcupti {

// cuptiFinalize: forget the subscriber and everything it enabled.
void drop_subscriber();

}  // namespace simcupti
