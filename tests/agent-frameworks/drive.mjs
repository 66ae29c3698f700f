// drive.mjs - runs one agent framework against runcell's MCP server with the model at an
// OpenAI-compatible URL (tests/lib/scripted_model.py in the tests), every setting left at the
// framework's default but where the model and the server are, and prints one line of JSON:
// {final, error}. Each framework talks to the model the way it does by default: the Agents
// SDK and the AI SDK's OpenAI provider with the Responses API, LangChain's ChatOpenAI with
// Chat Completions. Nothing here decides pass or fail.
//
// usage: node drive.mjs FRAMEWORK TRANSPORT MODEL_URL TARGET [TOKEN] PROMPT
//   FRAMEWORK  openai-agents | ai-sdk | langchain | sandbox-e2b
//   TRANSPORT  stdio (TARGET: the runcell binary, run as `runcell mcp`) | http (TARGET: /mcp's URL)
//              | e2b (sandbox-e2b: an Agents SDK SandboxAgent on @openai/agents-extensions'
//              E2BSandboxClient, which E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY point at
//              `runcell serve --e2b`; TARGET unused)
const [framework, transport, modelUrl, target, ...rest] = process.argv.slice(2);
const prompt = rest.pop();
const token = rest[0];
const headers = token ? { Authorization: `Bearer ${token}` } : {};
const instructions = "You analyse data with runcell's tools.";

async function openaiAgents() {
    const { Agent, run, MCPServerStdio, MCPServerStreamableHttp, setDefaultOpenAIClient,
            setTracingDisabled } = await import("@openai/agents");
    const { default: OpenAI } = await import("openai");
    setTracingDisabled(true);
    setDefaultOpenAIClient(new OpenAI({ baseURL: modelUrl, apiKey: "test" }));
    const server = transport === "stdio"
        ? new MCPServerStdio({ name: "runcell", command: target, args: ["mcp"] })
        : new MCPServerStreamableHttp({ name: "runcell", url: target, requestInit: { headers } });
    await server.connect();
    try {
        const agent = new Agent({ name: "analyst", instructions, model: "scripted",
                                  mcpServers: [server] });
        const result = await run(agent, prompt, { maxTurns: 40 });
        return result.finalOutput;
    } finally {
        await server.close();
    }
}

async function aiSdk() {
    const { generateText, stepCountIs } = await import("ai");
    const { createMCPClient } = await import("@ai-sdk/mcp");
    const { createOpenAI } = await import("@ai-sdk/openai");
    let mcpTransport;
    if (transport === "stdio") {
        const { Experimental_StdioMCPTransport } = await import("@ai-sdk/mcp/mcp-stdio");
        mcpTransport = new Experimental_StdioMCPTransport({ command: target, args: ["mcp"] });
    } else {
        mcpTransport = { type: "http", url: target, headers };
    }
    const mcp = await createMCPClient({ transport: mcpTransport });
    try {
        const provider = createOpenAI({ baseURL: modelUrl, apiKey: "test" });
        const result = await generateText({
            model: provider("scripted"), system: instructions, prompt,
            tools: await mcp.tools(), stopWhen: stepCountIs(40),
        });
        return result.text;
    } finally {
        await mcp.close();
    }
}

async function langchain() {
    const { MultiServerMCPClient } = await import("@langchain/mcp-adapters");
    const { ChatOpenAI } = await import("@langchain/openai");
    const { createReactAgent } = await import("@langchain/langgraph/prebuilt");
    const server = transport === "stdio"
        ? { transport: "stdio", command: target, args: ["mcp"] }
        : { transport: "http", url: target, headers };
    const client = new MultiServerMCPClient({ mcpServers: { runcell: server } });
    try {
        const llm = new ChatOpenAI({ model: "scripted", apiKey: "test",
                                     configuration: { baseURL: modelUrl } });
        const agent = createReactAgent({ llm, tools: await client.getTools(), prompt: instructions });
        const result = await agent.invoke({ messages: [{ role: "user", content: prompt }] },
                                          { recursionLimit: 80 });
        const last = result.messages[result.messages.length - 1];
        return typeof last.content === "string" ? last.content : JSON.stringify(last.content);
    } finally {
        await client.close();
    }
}

async function sandboxE2b() {
    const { run, setDefaultOpenAIClient, setTracingDisabled } = await import("@openai/agents");
    const { SandboxAgent } = await import("@openai/agents/sandbox");
    const { E2BSandboxClient } = await import("@openai/agents-extensions/sandbox/e2b");
    const { default: OpenAI } = await import("openai");
    setTracingDisabled(true);
    setDefaultOpenAIClient(new OpenAI({ baseURL: modelUrl, apiKey: "test" }));
    const agent = new SandboxAgent({ name: "analyst", instructions, model: "scripted" });
    const result = await run(agent, prompt, { maxTurns: 40, sandbox: { client: new E2BSandboxClient() } });
    return result.finalOutput;
}

const frameworks = { "openai-agents": openaiAgents, "ai-sdk": aiSdk, langchain,
                     "sandbox-e2b": sandboxE2b };
let out;
try {
    out = { final: await frameworks[framework]() };
} catch (e) {
    out = { error: String(e && e.stack || e) };
}
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(0);
