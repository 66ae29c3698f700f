/* spawn-int.h - what spawn.c and template.c share inside the sandbox module. */
#ifndef RUNCELL_SPAWN_INT_H
#define RUNCELL_SPAWN_INT_H

#include <jansson.h>

#include "sandbox/sandbox.h"

/* A sandbox struct with its name, cgroup and limits set up, not yet started. */
int sandbox_prepare(struct sandbox_host *host, const struct sandbox_spec *spec,
                    struct sandbox **ret);
/* The JSON configuration of sb for the helper (or the template); caller decrefs. */
json_t *sandbox_config(const struct sandbox *sb, const struct workspace *ws,
                       const struct sandbox_spec *spec);
/* Asks the template to make sb; on success sb runs. 0 or -errno with err_msg(). */
int template_spawn(struct sandbox_host *host, struct sandbox *sb, struct workspace *ws,
                   const struct sandbox_spec *spec);
void template_stop(struct sandbox_host *host);

#endif
