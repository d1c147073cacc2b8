/* mgtrain's version string (CMakeLists.txt defines MGT_VERSION_STRING at configure time). */
#include "mgt/version.h"

#ifndef MGT_VERSION_STRING
#define MGT_VERSION_STRING "unknown"
#endif

const char *mgt_version(void) { return MGT_VERSION_STRING; }
