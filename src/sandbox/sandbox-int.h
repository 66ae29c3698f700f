/* sandbox-int.h - what the daemon side and the runcell-sandbox helper agree on. */
#ifndef RUNCELL_SANDBOX_INT_H
#define RUNCELL_SANDBOX_INT_H

/* File descriptors of the helper at exec: 0-2 are the payload's stdio. */
#define HELPER_FD_CONFIG 3 /* JSON config, read to EOF */
#define HELPER_FD_STATUS 4 /* status lines to the daemon */
#define HELPER_FD_EXTRA  5 /* first of cfg.extra_fds fds handed to the payload as 3.. */

/* The user the sandboxed code runs as, inside the user namespace. */
#define SANDBOX_UID 1000
#define SANDBOX_GID 1000

/* How many hex digits of a sandbox's instance (128 random bits, its boot id) name its cgroup
 * leaf and stand in its PID 1's command line. */
#define SANDBOX_INSTANCE_SHORT 16

/* Status lines, helper -> daemon, one per line:
 *   "pid N"          the sandbox init's pid in the daemon's PID namespace (outer helper)
 *   "ready"          the root is built; the payload is about to exec
 *   "error MESSAGE"  setup failed; the sandbox is gone
 *   "exit N"         the payload exited with status N
 *   "signal N"       the payload was killed by signal N
 * EOF means the sandbox init has exited. */

#endif
