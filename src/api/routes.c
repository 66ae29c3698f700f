/* routes.c - the native API's route table (docs/API.md): sessions, executions, files, stored
 * sessions, the agent and the review queue, each a handler in a routes_*.c beside it. */
#include "api/api.h"

static const struct route api_routes[] = {
    {"POST", "/v1/sessions", h_session_create, 0, NULL},
    {"GET", "/v1/sessions", h_session_list, 0, NULL},
    {"GET", "/v1/sessions/{id}", h_session_get, 0, NULL},
    {"DELETE", "/v1/sessions/{id}", h_session_delete, 0, NULL},
    {"POST", "/v1/sessions/{id}/execute", h_execute, ROUTE_EXECUTES, NULL},
    {"GET", "/v1/sessions/{id}/executions", h_executions_list, 0, NULL},
    {"GET", "/v1/sessions/{id}/executions/{eid}", h_execution_get, 0, NULL},
    {"GET", "/v1/sessions/{id}/executions/{eid}/events", h_execution_events, 0, NULL},
    {"POST", "/v1/sessions/{id}/executions/{eid}/cancel", h_execution_cancel, 0, NULL},
    {"DELETE", "/v1/sessions/{id}/executions/{eid}", h_execution_delete, 0, NULL},
    {"GET", "/v1/sessions/{id}/notebook", h_notebook_get, 0, NULL},
    {"PUT", "/v1/sessions/{id}/notebook", h_notebook_put, 0, NULL},
    {"POST", "/v1/sessions/{id}/interrupt", h_session_interrupt, 0, NULL},
    {"POST", "/v1/sessions/{id}/restart", h_session_restart, 0, NULL},
    {"POST", "/v1/sessions/{id}/undo", h_session_undo, 0, NULL},
    {"POST", "/v1/sessions/{id}/fork", h_session_fork, 0, NULL},
    {"POST", "/v1/sessions/{id}/pause", h_session_pause, 0, NULL},
    {"POST", "/v1/sessions/{id}/resume", h_session_resume, 0, NULL},
    {"POST", "/v1/sessions/{id}/snapshots", h_snapshot_create, 0, NULL},
    {"GET", "/v1/snapshots", h_snapshot_list, 0, NULL},
    {"GET", "/v1/snapshots/{id}", h_snapshot_get, 0, NULL},
    {"DELETE", "/v1/snapshots/{id}", h_snapshot_delete, 0, NULL},
    {"POST", "/v1/sessions/{id}/checkpoint", h_session_checkpoint, 0, NULL},
    {"GET", "/v1/sessions/{id}/events", h_session_events, 0, NULL},
    {"PATCH", "/v1/sessions/{id}/network", h_session_network, 0, NULL},
    {"GET", "/v1/sessions/{id}/files", h_files_list, 0, NULL},
    {"GET", "/v1/sessions/{id}/files/{path}", h_file_get, 0, NULL},
    {"PUT", "/v1/sessions/{id}/files/{path}", h_file_put, ROUTE_STREAM_BODY, h_file_put_chunk,
     h_file_put_admit},
    {"DELETE", "/v1/sessions/{id}/files/{path}", h_file_delete, 0, NULL},
    {"POST", "/v1/execute", h_oneshot, 0, NULL},
    {"POST", "/v1/agent/runs", h_agent_run, 0, NULL},
    {"GET", "/v1/reviews", h_review_list, 0, NULL},
    {"GET", "/v1/reviews/{id}", h_review_get, 0, NULL},
    {"POST", "/v1/reviews/{id}/resolve", h_review_resolve, 0, NULL},
};

const struct surface api_surface = {
    .name = "api", .routes = api_routes, .n_routes = ARRAY_SIZE(api_routes)};
