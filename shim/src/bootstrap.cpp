// The Python bootstrap's C half (design.md 6, docs/python.md).
//
// A preloaded library cannot run Python, so when libspillway.so is loaded
// into a Python interpreter with LD_PRELOAD, this constructor puts the
// directory `spillway_bootstrap/` that sits next to the library first on
// PYTHONPATH. Constructors of preloaded objects run before main, so the
// interpreter reads the new value; its `sitecustomize.py` installs the
// allocator once `torch` is imported.
//
// In any other process it does nothing: no output, no environment change, no
// driver call. A process is Python if the interpreter's Py_IsInitialized is
// in the global scope (the python executable, or the libpython it links);
// if Python is already running, the library was dlopen()ed late (e.g. by
// CUDAPluggableAllocator itself) and there is nothing left to bootstrap.
// Nothing here reads a SPILLWAY_ variable: configuration stays lazy.
#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

constexpr const char* kBootstrapDir = "spillway_bootstrap";

// True if `dir` is one of the colon-separated entries of `list`.
bool has_entry(const char* list, const std::string& dir) {
  const char* p = list;
  while (true) {
    const char* end = std::strchr(p, ':');
    const size_t n = end ? static_cast<size_t>(end - p) : std::strlen(p);
    if (n == dir.size() && std::strncmp(p, dir.data(), n) == 0) return true;
    if (!end) return false;
    p = end + 1;
  }
}

// The directory of this library, resolved to an absolute path now, while the
// working directory is still the one a relative LD_PRELOAD was given in.
std::string library_dir() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&library_dir), &info) || !info.dli_fname) return {};
  char resolved[PATH_MAX];
  if (!realpath(info.dli_fname, resolved)) return {};
  std::string path(resolved);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

__attribute__((constructor)) void bootstrap_python() {
  using IsInitialized = int (*)();
  auto is_initialized = reinterpret_cast<IsInitialized>(dlsym(RTLD_DEFAULT, "Py_IsInitialized"));
  if (!is_initialized || is_initialized()) return;
  const std::string lib_dir = library_dir();
  if (lib_dir.empty()) return;
  const std::string dir = lib_dir + "/" + kBootstrapDir;
  if (access((dir + "/sitecustomize.py").c_str(), R_OK) != 0) {
    // Only a Python process gets here: say once why nothing will happen.
    std::fprintf(stderr,
                 "[spillway W] %s/sitecustomize.py not found next to the library: the allocator "
                 "will not be installed into torch automatically\n",
                 dir.c_str());
    return;
  }
  const char* old = std::getenv("PYTHONPATH");
  if (old && has_entry(old, dir)) return;  // inherited from a preloaded parent
  const std::string value = old && *old ? dir + ":" + old : dir;
  setenv("PYTHONPATH", value.c_str(), 1);
}

}  // namespace
