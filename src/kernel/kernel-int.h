/* kernel-int.h - the fields of a kernel, private to kernel.c (and the tests and fuzz targets
 * of its protocol, which make one on a socket without a sandbox). */
#ifndef RUNCELL_KERNEL_INT_H
#define RUNCELL_KERNEL_INT_H

#include "kernel/kernel.h"

struct kernel {
    struct sandbox *sb;
    int chan_fd; /* our end of the control socket */
    int out_fd;  /* read ends of the kernel's stdout/stderr pipes */
    int err_fd;
    struct buf in;
    char *python_version;
    /* Writes to chan_fd: a request and an interrupt frame never interleave. An interrupt
     * that comes while a request is being written is owed, and sent right after it (its
     * frame, then its one SIGINT), never with a later request. owed_lock guards the two
     * flags and is never held across a write. */
    pthread_mutex_t write_lock;
    pthread_mutex_t owed_lock;
    bool writing_request;
    bool interrupt_owed;
};

#endif
