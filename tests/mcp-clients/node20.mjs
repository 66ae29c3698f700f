// node20.mjs - lets the MCP conformance suite, written for Node 22, run on Node 20 (Debian's
// node is 20): its CLI imports fs.globSync, which it uses only in its tier-check command. On
// a Node that lacks it, the suite's import of "fs" is given fs with a globSync that says so.
// Used as: node --import ./node20.mjs node_modules/@modelcontextprotocol/conformance/...
import { register } from "node:module";
import * as fs from "node:fs";

if (!("globSync" in fs))
    register("./node20-hooks.mjs", import.meta.url);
