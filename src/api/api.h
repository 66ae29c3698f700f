/* api.h - runcell's own REST API (/v1/...): its route table and what its files share. A
 * surface over the session layer (session.h) on the HTTP core (http.h). */
#ifndef RUNCELL_API_H
#define RUNCELL_API_H

#include "http/http.h"

/* The native API's routes, for the server's table of surfaces. */
extern const struct surface api_surface;

/* ---- route handlers ---- */
enum MHD_Result h_session_create(struct request *rq);
enum MHD_Result h_session_list(struct request *rq);
enum MHD_Result h_session_get(struct request *rq);
enum MHD_Result h_session_delete(struct request *rq);
enum MHD_Result h_session_interrupt(struct request *rq);
enum MHD_Result h_session_restart(struct request *rq);
enum MHD_Result h_session_undo(struct request *rq);
enum MHD_Result h_session_network(struct request *rq);
/* routes_state.c */
enum MHD_Result h_session_fork(struct request *rq);
enum MHD_Result h_session_pause(struct request *rq);
enum MHD_Result h_session_resume(struct request *rq);
enum MHD_Result h_snapshot_create(struct request *rq);
enum MHD_Result h_snapshot_list(struct request *rq);
enum MHD_Result h_snapshot_get(struct request *rq);
enum MHD_Result h_snapshot_delete(struct request *rq);
enum MHD_Result h_session_events(struct request *rq);
enum MHD_Result h_execute(struct request *rq);
enum MHD_Result h_executions_list(struct request *rq);
enum MHD_Result h_execution_get(struct request *rq);
enum MHD_Result h_execution_events(struct request *rq);
enum MHD_Result h_execution_cancel(struct request *rq);
enum MHD_Result h_execution_delete(struct request *rq);
enum MHD_Result h_notebook_get(struct request *rq);
enum MHD_Result h_notebook_put(struct request *rq);
enum MHD_Result h_oneshot(struct request *rq);
enum MHD_Result h_files_list(struct request *rq);
enum MHD_Result h_file_get(struct request *rq);
enum MHD_Result h_file_put(struct request *rq);
int h_file_put_chunk(struct request *rq, const char *data, size_t n);
bool h_file_put_admit(struct request *rq, uint64_t declared);
enum MHD_Result h_file_delete(struct request *rq);
enum MHD_Result h_agent_run(struct request *rq);
enum MHD_Result h_review_list(struct request *rq);
enum MHD_Result h_review_get(struct request *rq);
enum MHD_Result h_review_resolve(struct request *rq);
/* Frees what h_file_put_chunk left behind when the request ends early. */
void upload_abort(struct request *rq);

/* Takes a reference on the {id} session, or replies 404/expired and returns NULL. */
struct session *acquire_session(struct request *rq);
/* ---- stored sessions (routes_persist.c) ---- */
/* Replies 404 for the {id} session that is not live (err from session_table_acquire),
 * saying whether it is stored and resumable. */
enum MHD_Result reply_not_live(struct request *rq, int err);

/* ---- the fleet (routes_fleet.c) ---- */
/* This node's name: --node, else the host name's first label, lower-cased. 0 or -EINVAL
 * with err_msg(); caller frees. */
int fleet_node_name(const char *given, char **ret);
/* Opens the fleet of srv (--fleet): leases in its store, renewed from now on. */
int fleet_open(struct server *srv);
/* For a session id not live here: takes it over when the shared store says it ran on a node
 * that is gone (its lease expired or was released by a shutdown), resuming it under the
 * same id; true when handled: *ret (a reference) set, or NULL after an error reply. false:
 * not a session of the fleet (the caller replies 404). */
bool fleet_takeover(struct request *rq, const char *id, struct session **ret);
/* Whether this node still holds s's lease; false with s put: after replying 503 (the node is
 * fenced), or without a reply when another node took it (s is dropped). */
bool fleet_check(struct request *rq, const char *id, struct session *s);
/* /healthz in a fleet: the node lease into j ("fleet"), and 503 with "status" and "reason"
 * when the node holds no valid lease or its last store request failed. */
void fleet_healthz(struct server *srv, json_t *j, unsigned *status);
/* Replies 503 node_fenced with why and a Retry-After. */
enum MHD_Result fleet_reply_fenced(struct request *rq, const char *why);
/* ---- forwarding (fleet_forward.c) ---- */
/* Called once a request is routed and authenticated, before its body: refuses everything but
 * health, metrics and the console's files while the node is fenced, and hands a request for a
 * session that another live node owns to that node (its body streamed there, the answer streamed
 * back). true when it took the request over (replied, or forwarding). */
bool fleet_route(struct request *rq);
/* From a handler, its JSON body read: forwards rq to the live node that owns its session (it
 * won a takeover this node lost); true after replying. */
bool fleet_forward_now(struct request *rq);
/* Frees what forwarding rq left (request_free). */
void fleet_forward_free(struct request *rq);
/* POST /v1/sessions/{id}/checkpoint */
enum MHD_Result h_session_checkpoint(struct request *rq);
/* With resume_from in *body: checks it and puts the stored session's options under the
 * body's own (*body replaced). False after replying 400/404. */
bool resume_options(struct request *rq, json_t **body);
/* A session's JSON description. */
json_t *session_info(const char *id, struct session *s);
/* Session options from a create (or one-shot) body, validated against the server's maxima;
 * false after replying 400. */
bool session_opts_from_json(struct request *rq, json_t *body, struct session_opts *o);
/* The NDJSON event for an execution event; caller decrefs. */
json_t *exec_event_json(const struct exec_event *ev);
/* True when the client asked for NDJSON events (Accept: application/x-ndjson). */
bool wants_ndjson(struct request *rq);
/* Interrupts the running one-shot executions (shutdown). */
void oneshots_interrupt(struct server *srv);
/* Kills the one-shot executions still running (shutdown, after the interrupt grace). */
void oneshots_kill(struct server *srv);

#endif
