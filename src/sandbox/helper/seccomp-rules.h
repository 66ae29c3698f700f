/* seccomp-rules.h - the sandbox's filter compiled with libseccomp (seccomp-rules.c): for
 * the build's generator and the unit tests only; the helper embeds the result. */
#ifndef RUNCELL_SECCOMP_RULES_H
#define RUNCELL_SECCOMP_RULES_H

#include <linux/filter.h>

/* The program (len instructions, malloc'd with the struct), or NULL with errno set. */
struct sock_fprog *seccomp_compile(void);

#endif
