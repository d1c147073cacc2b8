/* mgtrain's version: the release and the commit it was built from. */
#ifndef MGT_VERSION_H
#define MGT_VERSION_H

/* "0.1.0 (git 1a2b3c4)": the project's version and `git describe` at configure time. */
const char *mgt_version(void);

#endif
