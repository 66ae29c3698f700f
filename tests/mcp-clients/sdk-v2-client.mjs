// sdk-v2-client.mjs - drives runcell's MCP server with the official TypeScript SDK's v2 client
// (@modelcontextprotocol/client), pinned to protocol 2026-07-28, and prints what it saw as one
// line of JSON for tests/integration/test_conformance.py to check. The client validates every
// result against its own schemas of that revision; nothing here decides pass or fail.
//
// usage: node sdk-v2-client.mjs http URL TOKEN | stdio RUNCELL
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";

const [kind, target, token] = process.argv.slice(2);

function summary(result) {
    const first = (result.content || []).find((c) => c.type === "text");
    return first ? first.text : "";
}

async function main() {
    const transport = kind === "stdio"
        ? new StdioClientTransport({ command: target, args: ["mcp"] })
        : new StreamableHTTPClientTransport(new URL(target), {
            requestInit: { headers: { Authorization: `Bearer ${token}` } },
        });
    const client = new Client({ name: "runcell-sdk-v2", version: "1.0.0" },
                              { versionNegotiation: { mode: { pin: "2026-07-28" } } });
    await client.connect(transport);
    try {
        const tools = await client.listTools();
        const created = await client.callTool({ name: "create_session", arguments: {} });
        const sid = created.structuredContent.session_id;
        await client.callTool({ name: "run_code", arguments: { session_id: sid, code: "x = 42" } });
        const second = await client.callTool({ name: "run_code",
                                                arguments: { session_id: sid, code: "x + 1" } });
        const failed = await client.callTool({ name: "run_code",
                                                arguments: { session_id: sid, code: "{}['k']" } });
        let ping;
        try {
            await client.ping();
            ping = "answered";
        } catch (e) {
            ping = e.code || String(e);
        }
        return {
            protocolVersion: client.getNegotiatedProtocolVersion(),
            server: client.getServerVersion(),
            instructions: client.getInstructions(),
            tools: tools.tools.map((t) => t.name),
            second: summary(second),
            error_result: { isError: !!failed.isError, text: summary(failed) },
            ping,
        };
    } finally {
        await client.close();
    }
}

let out;
try {
    out = await main();
} catch (e) {
    out = { error: String(e && e.stack || e) };
}
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(0);
