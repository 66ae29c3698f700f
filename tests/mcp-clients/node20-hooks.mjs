// node20-hooks.mjs - the module resolve hook node20.mjs registers (see there).
const shim = "data:text/javascript," + encodeURIComponent(
    'export * from "node:fs"; export { default } from "node:fs"; ' +
    'export function globSync() { throw new Error("fs.globSync needs Node 22"); }');

export async function resolve(specifier, context, next) {
    if ((specifier === "fs" || specifier === "node:fs") &&
        context.parentURL && context.parentURL.includes("/@modelcontextprotocol/conformance/"))
        return { url: shim, shortCircuit: true };
    return next(specifier, context);
}
