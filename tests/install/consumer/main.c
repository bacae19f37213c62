/* A program built against an installed spillway (tests/install): it links
 * spillway::spillway (find_package) or pkg-config's flags, calls the C ABI and
 * fails unless the library's version is the one it was built for. */
#include <spillway.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  const char* version = spillway_version();
  printf("spillway %s\n", version);
  return strcmp(version, SPILLWAY_EXPECTED_VERSION) == 0 ? 0 : 1;
}
