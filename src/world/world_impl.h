/* The world module's private parts, shared by its implementations. */
#ifndef MGT_WORLD_IMPL_H
#define MGT_WORLD_IMPL_H

#include "mgt/world.h"

/* The rank count the launcher's environment announces (1 without a launcher); *var (when
   not NULL) gets the variable it came from, or NULL. */
int world_env_size(const char **var);

#endif
