// A CUPTI in front of the simulated one, for bench_tracker: it defines
// cuptiSubscribe only, which subscribes through the simulated CUPTI and keeps
// the subscriber's callback and its argument where the benchmark can read
// them (bench_cupti_subscriber). Every other entry point is the simulated
// CUPTI's own: this library needs libcupti.so.13, and dlsym on its handle
// (cupti::load) finds what it does not define there.
//
// The benchmark points SPILLWAY_CUPTI_PATH here, so that the shim's Runtime
// starts its tracker exactly as in a preloaded job, subscribed to the
// simulated CUPTI, and the benchmark can then call that subscriber's entry
// point as CUPTI calls it at a launch's enter and exit, without the driver's
// own launch in between. Nothing here runs on the launch path.
#include <cupti.h>
#include <dlfcn.h>

extern "C" {

struct BenchCuptiSubscriber {
  CUpti_CallbackFunc callback;
  void* userdata;
};

__attribute__((visibility("default")))
BenchCuptiSubscriber bench_cupti_subscriber = {nullptr, nullptr};

__attribute__((visibility("default"))) CUptiResult CUPTIAPI
cuptiSubscribe(CUpti_SubscriberHandle* subscriber, CUpti_CallbackFunc callback, void* userdata) {
  // Loaded already: it is this library's dependency.
  void* lib = dlopen("libcupti.so.13", RTLD_NOW | RTLD_NOLOAD);
  auto real =
      lib ? reinterpret_cast<decltype(&cuptiSubscribe)>(dlsym(lib, "cuptiSubscribe")) : nullptr;
  if (!real || real == &cuptiSubscribe) return CUPTI_ERROR_NOT_INITIALIZED;
  const CUptiResult r = real(subscriber, callback, userdata);
  if (r == CUPTI_SUCCESS) bench_cupti_subscriber = {callback, userdata};
  return r;
}

}  // extern "C"
