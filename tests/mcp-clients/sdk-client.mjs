// sdk-client.mjs - drives runcell's /mcp with the official MCP TypeScript SDK over Streamable
// HTTP, one scenario per run, and prints what it saw as one line of JSON for
// tests/integration/test_conformance.py to check. Nothing here decides pass or fail.
//
// usage: node sdk-client.mjs URL TOKEN SCENARIO
//   basic        initialize, tools/list, run_code twice (state kept), then DELETE
//   null-args    run_code with every optional argument null
//   delete-busy  run_code of a long cell; once its output shows it running, DELETE the
//                session; reports how the call ended (it must not wait for a timeout)
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, token, scenario] = process.argv.slice(2);

function connect() {
    const transport = new StreamableHTTPClientTransport(new URL(url), {
        requestInit: { headers: { Authorization: `Bearer ${token}` } },
    });
    const client = new Client({ name: "runcell-conformance", version: "1.0.0" });
    return client.connect(transport).then(() => ({ client, transport }));
}

// The summary: a run's first text part (the last one names its session and cell).
function text(result) {
    const first = (result.content || []).find((c) => c.type === "text");
    return first ? first.text : "";
}

async function basic() {
    const { client, transport } = await connect();
    const tools = await client.listTools();
    const first = await client.callTool({ name: "run_code", arguments: { code: "x = 6 * 7\nprint(x)" } });
    const second = await client.callTool({ name: "run_code", arguments: { code: "print(x + 1)" } });
    const out = {
        protocolVersion: transport.protocolVersion,
        sessionId: transport.sessionId,
        server: client.getServerVersion(),
        tools: tools.tools.map((t) => ({ name: t.name, inputSchema: t.inputSchema })),
        first: { text: text(first), isError: !!first.isError },
        second: { text: text(second), isError: !!second.isError },
    };
    await transport.terminateSession();
    await client.close();
    return out;
}

async function nullArgs() {
    const { client, transport } = await connect();
    const r = await client.callTool({
        name: "run_code",
        arguments: { code: "print('null ok')", language: null, session_id: null, timeout_s: null },
    });
    await transport.terminateSession();
    await client.close();
    return { text: text(r), isError: !!r.isError };
}

// The call's own timeout is long, so that a server that never answered would show as a
// RequestTimeout (-32001) well after the error a session end must bring at once.
async function deleteBusy() {
    const { client, transport } = await connect();
    let deleted = null;
    let deleteError = null;
    const t0 = Date.now();
    const call = client.callTool(
        { name: "run_code", arguments: { code: "import time\nprint('started', flush=True)\ntime.sleep(600)" } },
        undefined,
        {
            timeout: 300000,
            onprogress: (p) => {
                if (deleted || !String(p.message || "").includes("started"))
                    return;
                deleted = Date.now();
                transport.terminateSession().catch((e) => { deleteError = String(e); });
            },
        },
    );
    let outcome;
    try {
        const r = await call;
        outcome = { resolved: true, text: text(r), isError: !!r.isError };
    } catch (e) {
        outcome = { resolved: false, code: e.code, message: String(e.message) };
    }
    outcome.deleteSent = deleted !== null;
    outcome.deleteError = deleteError;
    outcome.msAfterDelete = deleted === null ? null : Date.now() - deleted;
    outcome.msTotal = Date.now() - t0;
    await client.close();
    return outcome;
}

const scenarios = { basic, "null-args": nullArgs, "delete-busy": deleteBusy };
if (!scenarios[scenario]) {
    console.error(`unknown scenario '${scenario}'; known: ${Object.keys(scenarios).join(", ")}`);
    process.exit(2);
}
try {
    console.log(JSON.stringify(await scenarios[scenario]()));
} catch (e) {
    console.log(JSON.stringify({ failed: String(e && e.stack || e), code: e && e.code }));
    process.exit(1);
}
