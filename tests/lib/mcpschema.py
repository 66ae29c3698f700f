"""mcpschema - validates MCP messages against the official JSON schema of their revision
(tests/mcp-schemas/, copied unchanged from the specification's repository; the tasks
extension's from its own).

    check(version, msg, method=None)   raises SchemaError naming what does not fit

version is the revision the client speaks; method is the request a response answers (its
result is checked against that method's result type), None for notifications and for
errors.
"""
import json
import os

import jsonschema

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMAS = os.path.join(HERE, "..", "mcp-schemas")

# The result type of each method, by name in the schemas.
RESULTS = {
    "initialize": "InitializeResult",
    "ping": "EmptyResult",
    "tools/list": "ListToolsResult",
    "tools/call": "CallToolResult",
    "server/discover": "DiscoverResult",
}
# The tasks extension's (schema ext-tasks.json).
TASK_RESULTS = {
    "tasks/get": "GetTaskResult",
    "tasks/update": "UpdateTaskResult",
    "tasks/cancel": "CancelTaskResult",
}
# Errors whose codes the 2026-07-28 schema gives a shape of their own.
ERRORS_2026 = {-32020: "HeaderMismatchError", -32021: "MissingRequiredClientCapabilityError",
               -32022: "UnsupportedProtocolVersionError"}

_cache = {}


class SchemaError(AssertionError):
    pass


def _validator(name, definition):
    key = (name, definition)
    if key not in _cache:
        with open(os.path.join(SCHEMAS, name + ".json")) as f:
            schema = json.load(f)
        defs = "$defs" if "$defs" in schema else "definitions"
        root = {"$schema": schema.get("$schema", "https://json-schema.org/draft/2020-12/schema"),
                defs: schema[defs], "$ref": "#/%s/%s" % (defs, definition)}
        cls = jsonschema.validators.validator_for(root)
        _cache[key] = cls(root)
    return _cache[key]


def _validate(name, definition, value, msg):
    v = _validator(name, definition)
    errors = sorted(v.iter_errors(value), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        raise SchemaError("not a valid %s of MCP %s at %s: %s\nmessage: %s" % (
            definition, name, "/".join(str(p) for p in e.path) or "(top)", e.message,
            json.dumps(msg)[:3000]))


def _names(version):
    if version in ("2024-11-05", "2025-03-26", "2025-06-18"):
        return "JSONRPCResponse", "JSONRPCError"
    return "JSONRPCResultResponse", "JSONRPCErrorResponse"


def check(version, msg, method=None):
    """Validates one message a server sent to a client of revision version."""
    if isinstance(msg, list):  # a batch (2025-03-26)
        for m in msg:
            check(version, m, method)
        return
    result_name, error_name = _names(version)
    if "method" in msg:  # a notification
        if msg["method"] == "notifications/tasks":
            _validate("ext-tasks", "TaskStatusNotification", msg, msg)
        else:
            _validate(version, "ServerNotification", msg, msg)
        return
    if "error" in msg:
        _validate(version, error_name, msg, msg)
        if version == "2026-07-28" and msg["error"].get("code") in ERRORS_2026:
            _validate(version, ERRORS_2026[msg["error"]["code"]], msg, msg)
        return
    _validate(version, result_name, msg, msg)
    result = msg["result"]
    if method in TASK_RESULTS:
        _validate("ext-tasks", TASK_RESULTS[method], result, msg)
    elif method == "tools/call" and result.get("resultType") == "task":
        _validate("ext-tasks", "CreateTaskResult", result, msg)
    elif method in RESULTS:
        _validate(version, RESULTS[method], result, msg)
    if version == "2026-07-28" and "resultType" not in result:
        raise SchemaError("a 2026-07-28 result without resultType: %s" % json.dumps(msg)[:2000])
