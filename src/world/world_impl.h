/* The world module's private parts, shared by its implementations. */
#ifndef MGT_WORLD_IMPL_H
#define MGT_WORLD_IMPL_H

#include "mgt/world.h"

/* The rank count the launcher's environment announces (1 without a launcher); *var (when
   not NULL) gets the variable it came from, or NULL. */
int world_env_size(const char **var);

/* FNV-1a, 64 bits, of n bytes: the settings' digest every node compares. */
uint64_t world_digest(const void *p, size_t n);

/* The first line where two settings texts (lines "NAME\tVALUE\n") differ, as the error of
   mgt_world_check_same: node `rank` holds `mine`, node 0 holds `theirs`. */
mgt_status world_settings_differ(const char *mine, int rank, const char *theirs);

#endif
