// The fixtures the official MCP conformance suite
// (@modelcontextprotocol/conformance 0.1.16, its server scenarios) expects
// of the server it tests - the tools, resources, prompts and completions
// its checks name - served over MCP Streamable HTTP with the official SDK
// (McpServer, StreamableHTTPServerTransport; stateful: one Mcp-Session-Id
// and one McpServer per client), at /mcp.  The suite's own reference
// server is not in its npm package; this one is written from what the
// suite's checks read (conformance_test.sh runs it directly and behind
// `idem mcp --listen`).
//
//   node conformance_server.mjs [--host 127.0.0.1] [--port 0] [--port-file FILE]
//
//   --port 0          pick a free port; it is written to --port-file (whole,
//                     by rename) once the server listens, and said on stderr:
//                     "conformance_server: listening on http://HOST:PORT/mcp"
//
// What each scenario gets:
//   tools      test_simple_text, test_image_content (a 1x1 PNG),
//              test_audio_content (a short WAV), test_embedded_resource,
//              test_multiple_content_types (text, image, resource),
//              test_tool_with_logging (3 notifications/message at info,
//              50 ms apart, on the call's own stream, at the level the
//              session set), test_tool_with_progress (0, 50, 100 of 100 to
//              the request's progressToken), test_error_handling (throws:
//              isError), test_sampling and test_elicitation (a
//              sampling/createMessage or elicitation/create request to the
//              client on the call's stream), test_elicitation_sep1034_defaults
//              (defaults of every primitive type), test_elicitation_sep1330_enums
//              (the five enum forms), json_schema_2020_12_tool (listed with a
//              JSON Schema 2020-12 inputSchema: $schema, $defs,
//              additionalProperties), test_reconnection (SEP-1699: closes the
//              call's SSE stream, answers after the client resumes it with
//              Last-Event-ID).  The content tools say readOnlyHint: true;
//              the others say nothing, so a gateway guards them.
//   resources  test://static-text, test://static-binary, the template
//              test://template/{id}/data, test://watched-resource;
//              resources/subscribe and resources/unsubscribe
//   prompts    test_simple_prompt, test_prompt_with_arguments (arg1, arg2;
//              arg1 completes: completion/complete), test_prompt_with_embedded_resource,
//              test_prompt_with_image
//   logging    logging/setLevel (the SDK's, per session)
//   HTTP       Host must name this server on loopback and an Origin, when
//              sent, a loopback one: else 403 (DNS rebinding).  SSE answers
//              begin with a priming event (an id, empty data, retry) and
//              every event is kept per session, so that a stream that ends
//              early is resumed with GET and Last-Event-ID.
//
// On the protocol version of a session's later requests: the SDK decides
// whether a POST's stream may be closed early (and gets a priming event) by
// its MCP-Protocol-Version header (2025-11-25 and later).  The suite's
// SEP-1699 scenarios open their session with the SDK client (which
// negotiates 2025-11-25) and then send raw POSTs and GETs in it that say
// "2025-03-26"; a session's version was settled by its initialize, so this
// server reads a header that names an older version than the session's as
// the session's own.  A client that sends the negotiated version (the SDK's,
// idem's) is unaffected.
//
// SIGTERM / SIGINT end it.
import fs from "node:fs";
import http from "node:http";
import zlib from "node:zlib";
import { randomUUID } from "node:crypto";
import { McpServer, ResourceTemplate } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { completable } from "@modelcontextprotocol/sdk/server/completable.js";
import {
  CreateMessageResultSchema,
  ElicitResultSchema,
  ListToolsRequestSchema,
  SubscribeRequestSchema,
  UnsubscribeRequestSchema,
  LATEST_PROTOCOL_VERSION,
  SUPPORTED_PROTOCOL_VERSIONS,
  isInitializeRequest,
} from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";

const argv = process.argv.slice(2);
const opts = {};
for (let i = 0; i < argv.length; i++) {
  if (["--host", "--port", "--port-file"].includes(argv[i]) && i + 1 < argv.length) opts[argv[i]] = argv[++i];
  else {
    console.error("usage: conformance_server.mjs [--host 127.0.0.1] [--port 0] [--port-file FILE]");
    process.exit(2);
  }
}
const host = opts["--host"] ?? "127.0.0.1";

// ---- media: a 1x1 PNG and a WAV of a few silent samples, made here -------
function crc32(buf) {
  let c = ~0;
  for (const b of buf) {
    c ^= b;
    for (let k = 0; k < 8; k++) c = (c >>> 1) ^ (0xedb88320 & -(c & 1));
  }
  return ~c >>> 0;
}
function pngChunk(type, data) {
  const len = Buffer.alloc(4);
  len.writeUInt32BE(data.length);
  const td = Buffer.concat([Buffer.from(type, "ascii"), data]);
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(crc32(td));
  return Buffer.concat([len, td, crc]);
}
function onePixelPng(r, g, b) {
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(1, 0); // width
  ihdr.writeUInt32BE(1, 4); // height
  ihdr.set([8, 2, 0, 0, 0], 8); // 8 bits, truecolour, deflate, no filter, no interlace
  const row = Buffer.from([0, r, g, b]); // filter type 0, one RGB pixel
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    pngChunk("IHDR", ihdr),
    pngChunk("IDAT", zlib.deflateSync(row)),
    pngChunk("IEND", Buffer.alloc(0)),
  ]);
}
function silentWav(samples) {
  const rate = 8000, data = samples * 2; // mono, 16 bits
  const h = Buffer.alloc(44 + data);
  h.write("RIFF", 0, "ascii");
  h.writeUInt32LE(36 + data, 4);
  h.write("WAVEfmt ", 8, "ascii");
  h.writeUInt32LE(16, 16); // fmt chunk size
  h.writeUInt16LE(1, 20); // PCM
  h.writeUInt16LE(1, 22); // channels
  h.writeUInt32LE(rate, 24);
  h.writeUInt32LE(rate * 2, 28); // byte rate
  h.writeUInt16LE(2, 32); // block align
  h.writeUInt16LE(16, 34); // bits per sample
  h.write("data", 36, "ascii");
  h.writeUInt32LE(data, 40);
  return h;
}
const PNG = onePixelPng(0xff, 0, 0).toString("base64");
const WAV = silentWav(4).toString("base64");

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const text = (t) => ({ content: [{ type: "text", text: t }] });

// ---- SEP-1699: every event of a session's streams, kept for resumption ----
// Event ids are "<stream id>/<sequence number>"; a resumption replays what
// came after the given id on that stream (not the priming events: no data).
function eventStore() {
  const streams = new Map(); // stream id -> [{ id, message }]
  let seq = 0;
  return {
    async storeEvent(streamId, message) {
      const id = `${streamId}/${String(++seq).padStart(8, "0")}`;
      if (!streams.has(streamId)) streams.set(streamId, []);
      streams.get(streamId).push({ id, message });
      return id;
    },
    async getStreamIdForEventId(eventId) {
      const streamId = eventId.slice(0, eventId.lastIndexOf("/"));
      return streams.has(streamId) ? streamId : undefined;
    },
    async replayEventsAfter(lastEventId, { send }) {
      const streamId = lastEventId.slice(0, lastEventId.lastIndexOf("/"));
      const events = streams.get(streamId) ?? [];
      const from = events.findIndex((e) => e.id === lastEventId);
      for (const e of events.slice(from + 1))
        if (Object.keys(e.message).length) await send(e.id, e.message);
      return streamId;
    },
  };
}

// ---- one McpServer per session ---------------------------------------------
function makeServer() {
  const mcp = new McpServer(
    { name: "idem-conformance-fixture", version: "1.0.0" },
    { capabilities: { logging: {}, tools: { listChanged: true }, prompts: { listChanged: true },
                      resources: { subscribe: true, listChanged: true }, completions: {} } },
  );
  const server = mcp.server;
  const readOnly = { readOnlyHint: true, openWorldHint: false };

  // a log line about a request, on the request's own stream, unless the
  // session's level (logging/setLevel) is above it
  const log = async (extra, level, data) => {
    if (server.isMessageIgnored(level, extra.sessionId)) return;
    await extra.sendNotification({ method: "notifications/message",
                                   params: { level, logger: "conformance_server", data } });
  };

  // -- content
  mcp.registerTool("test_simple_text", { description: "Answers one text item", annotations: readOnly },
    async () => text("This is a simple text response for testing."));
  mcp.registerTool("test_image_content", { description: "Answers one image item (a 1x1 PNG)", annotations: readOnly },
    async () => ({ content: [{ type: "image", data: PNG, mimeType: "image/png" }] }));
  mcp.registerTool("test_audio_content", { description: "Answers one audio item (a WAV)", annotations: readOnly },
    async () => ({ content: [{ type: "audio", data: WAV, mimeType: "audio/wav" }] }));
  mcp.registerTool("test_embedded_resource", { description: "Answers an embedded text resource", annotations: readOnly },
    async () => ({ content: [{ type: "resource", resource: {
      uri: "test://embedded-resource", mimeType: "text/plain", text: "This is an embedded resource content." } }] }));
  mcp.registerTool("test_multiple_content_types",
    { description: "Answers a text, an image and an embedded resource", annotations: readOnly },
    async () => ({ content: [
      { type: "text", text: "Multiple content types test:" },
      { type: "image", data: PNG, mimeType: "image/png" },
      { type: "resource", resource: { uri: "test://mixed-content-resource", mimeType: "application/json",
                                      text: JSON.stringify({ test: "data", value: 123 }) } },
    ] }));

  // -- notifications during a call
  mcp.registerTool("test_tool_with_logging", { description: "Logs three lines at info while it runs", inputSchema: {} },
    async (_args, extra) => {
      await log(extra, "info", "Tool execution started");
      await sleep(50);
      await log(extra, "info", "Tool processing data");
      await sleep(50);
      await log(extra, "info", "Tool execution completed");
      return text("Logged three lines.");
    });
  mcp.registerTool("test_tool_with_progress", { description: "Reports progress 0, 50, 100 of 100", inputSchema: {} },
    async (_args, extra) => {
      const token = extra._meta?.progressToken;
      for (const p of [0, 50, 100]) {
        if (token !== undefined)
          await extra.sendNotification({ method: "notifications/progress",
                                         params: { progressToken: token, progress: p, total: 100,
                                                   message: `${p} of 100` } });
        if (p < 100) await sleep(50);
      }
      return text(token === undefined ? "Done (no progressToken: no progress sent)."
                                      : `Done; progress went to ${JSON.stringify(token)}.`);
    });
  mcp.registerTool("test_error_handling", { description: "Always fails (isError)" }, async () => {
    throw new Error("This tool intentionally returns an error for testing");
  });

  // -- requests to the client during a call (on the call's own stream)
  mcp.registerTool("test_sampling",
    { description: "Asks the client's model (sampling/createMessage)",
      inputSchema: { prompt: z.string().describe("what to ask the model") } },
    async ({ prompt }, extra) => {
      const r = await extra.sendRequest({ method: "sampling/createMessage", params: {
        messages: [{ role: "user", content: { type: "text", text: prompt } }], maxTokens: 100 } },
      CreateMessageResultSchema);
      const said = Array.isArray(r.content) ? r.content.map((c) => c.text ?? `[${c.type}]`).join(" ")
                                            : r.content?.text ?? `[${r.content?.type}]`;
      return text(`LLM response: ${said}`);
    });
  const elicit = async (extra, message, properties, required) => {
    const r = await extra.sendRequest({ method: "elicitation/create", params: {
      message, requestedSchema: { type: "object", properties, ...(required ? { required } : {}) } } },
    ElicitResultSchema);
    return r;
  };
  mcp.registerTool("test_elicitation",
    { description: "Asks the user (elicitation/create)",
      inputSchema: { message: z.string().describe("what to show the user") } },
    async ({ message }, extra) => {
      const r = await elicit(extra, message, {
        username: { type: "string", description: "User's response" },
        email: { type: "string", description: "User's email address" },
      }, ["username", "email"]);
      return text(`User response: action=${r.action}, content=${JSON.stringify(r.content ?? {})}`);
    });
  mcp.registerTool("test_elicitation_sep1034_defaults",
    { description: "Asks the user with a default for every primitive type (SEP-1034)", inputSchema: {} },
    async (_args, extra) => {
      const r = await elicit(extra, "Check these fields; each has a default", {
        name: { type: "string", description: "Name", default: "John Doe" },
        age: { type: "integer", description: "Age", default: 30 },
        score: { type: "number", description: "Score", default: 95.5 },
        status: { type: "string", description: "Status", enum: ["active", "inactive", "pending"], default: "active" },
        verified: { type: "boolean", description: "Verified", default: true },
      });
      return text(`Elicitation completed: action=${r.action}, content=${JSON.stringify(r.content ?? {})}`);
    });
  mcp.registerTool("test_elicitation_sep1330_enums",
    { description: "Asks the user with the five enum forms (SEP-1330)", inputSchema: {} },
    async (_args, extra) => {
      const choices = (pre, title) => [1, 2, 3].map((i) => ({ const: `${pre}${i}`, title: `${title} ${i}` }));
      const r = await elicit(extra, "Pick from these lists", {
        untitledSingle: { type: "string", description: "one of three", enum: ["option1", "option2", "option3"] },
        titledSingle: { type: "string", description: "one of three, titled", oneOf: choices("value", "Option") },
        legacyEnum: { type: "string", description: "one of three, titled the old way",
                      enum: ["opt1", "opt2", "opt3"], enumNames: ["First", "Second", "Third"] },
        untitledMulti: { type: "array", description: "any of three", minItems: 1, maxItems: 3,
                         items: { type: "string", enum: ["option1", "option2", "option3"] } },
        titledMulti: { type: "array", description: "any of three, titled", minItems: 1, maxItems: 3,
                       items: { anyOf: choices("value", "Choice") } },
      });
      return text(`Elicitation completed: action=${r.action}, content=${JSON.stringify(r.content ?? {})}`);
    });

  // -- SEP-1613: listed with this very schema (below); calls are checked by zod
  const schema2020 = {
    $schema: "https://json-schema.org/draft/2020-12/schema",
    type: "object",
    $defs: { address: { type: "object", properties: { street: { type: "string" }, city: { type: "string" } } } },
    properties: { name: { type: "string" }, address: { $ref: "#/$defs/address" } },
    additionalProperties: false,
  };
  mcp.registerTool("json_schema_2020_12_tool",
    { description: "Has a JSON Schema 2020-12 inputSchema ($schema, $defs, additionalProperties)",
      annotations: readOnly,
      inputSchema: { name: z.string().optional(),
                     address: z.object({ street: z.string().optional(), city: z.string().optional() }).optional() } },
    async (args) => text(`Called with ${JSON.stringify(args)}`));

  // -- SEP-1699: the call's stream is closed before the answer; the answer is
  // kept in the event store and reaches the client when it resumes the stream
  mcp.registerTool("test_reconnection",
    { description: "Closes its SSE stream mid-call and answers after the client resumes it (SEP-1699)",
      inputSchema: {} },
    async (_args, extra) => {
      if (extra.closeSSEStream) extra.closeSSEStream();
      await sleep(100);
      return text(extra.closeSSEStream ? "Answered after the stream was closed: the client resumed it."
                                       : "Answered on the first stream (this request cannot be resumed).");
    });

  // tools/list as the SDK makes it, but json_schema_2020_12_tool with its
  // schema as written (the SDK derives inputSchema from zod, which has no
  // $schema, $defs or additionalProperties: false to give).  The SDK's own
  // handler is an internal of Server (_requestHandlers); it is wrapped, not
  // replaced, so every other tool is listed as the SDK lists it.
  const sdkList = server._requestHandlers.get("tools/list");
  server.setRequestHandler(ListToolsRequestSchema, async (req, extra) => {
    const r = await sdkList(req, extra);
    return { ...r, tools: r.tools.map((t) => (t.name === "json_schema_2020_12_tool" ? { ...t, inputSchema: schema2020 } : t)) };
  });

  // -- resources
  mcp.registerResource("static-text", "test://static-text",
    { title: "Static text", description: "A text resource", mimeType: "text/plain" },
    async (uri) => ({ contents: [{ uri: uri.href, mimeType: "text/plain",
                                   text: "This is the content of the static text resource." }] }));
  mcp.registerResource("static-binary", "test://static-binary",
    { title: "Static binary", description: "A binary resource (a 1x1 PNG)", mimeType: "image/png" },
    async (uri) => ({ contents: [{ uri: uri.href, mimeType: "image/png", blob: PNG }] }));
  mcp.registerResource("template",
    new ResourceTemplate("test://template/{id}/data", { list: undefined }),
    { title: "Template", description: "A resource per id", mimeType: "application/json" },
    async (uri, { id }) => ({ contents: [{ uri: uri.href, mimeType: "application/json",
                                           text: JSON.stringify({ id, templateTest: true, data: `Data for ID: ${id}` }) }] }));
  mcp.registerResource("watched-resource", "test://watched-resource",
    { title: "Watched", description: "A resource one may subscribe to", mimeType: "text/plain" },
    async (uri) => ({ contents: [{ uri: uri.href, mimeType: "text/plain", text: "Watched resource content" }] }));
  const subscribed = new Set();
  server.setRequestHandler(SubscribeRequestSchema, async (req) => {
    subscribed.add(req.params.uri);
    return {};
  });
  server.setRequestHandler(UnsubscribeRequestSchema, async (req) => {
    subscribed.delete(req.params.uri);
    return {};
  });

  // -- prompts (and completion of test_prompt_with_arguments's arg1)
  mcp.registerPrompt("test_simple_prompt", { title: "Simple", description: "A prompt without arguments" },
    async () => ({ messages: [{ role: "user", content: { type: "text", text: "This is a simple prompt for testing." } }] }));
  const words = ["paris", "park", "party", "test", "testing", "tested"];
  mcp.registerPrompt("test_prompt_with_arguments",
    { title: "With arguments", description: "A prompt with two arguments",
      argsSchema: {
        arg1: completable(z.string().describe("First argument"), (v) => words.filter((w) => w.startsWith(v ?? ""))),
        arg2: z.string().describe("Second argument"),
      } },
    async ({ arg1, arg2 }) => ({ messages: [{ role: "user", content: { type: "text",
      text: `Prompt with arguments: arg1='${arg1}', arg2='${arg2}'` } }] }));
  mcp.registerPrompt("test_prompt_with_embedded_resource",
    { title: "With a resource", description: "A prompt that embeds a resource",
      argsSchema: { resourceUri: z.string().describe("the URI to embed") } },
    async ({ resourceUri }) => ({ messages: [
      { role: "user", content: { type: "resource", resource: { uri: resourceUri, mimeType: "text/plain",
                                                               text: "Embedded resource content for testing." } } },
      { role: "user", content: { type: "text", text: "Please process the embedded resource above." } },
    ] }));
  mcp.registerPrompt("test_prompt_with_image", { title: "With an image", description: "A prompt with an image" },
    async () => ({ messages: [
      { role: "user", content: { type: "image", data: PNG, mimeType: "image/png" } },
      { role: "user", content: { type: "text", text: "Please describe the image above." } },
    ] }));

  return mcp;
}

// ---- HTTP -----------------------------------------------------------------
const sessions = new Map(); // Mcp-Session-Id -> { transport, version }
let port = 0;

function rpcError(res, status, message, code = -32000) {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify({ jsonrpc: "2.0", id: null, error: { code, message } }));
}
// DNS rebinding: the Host a browser sends for a name that resolves here is
// that name; only loopback names with this port are this server
function hostOk(h) {
  return typeof h === "string" && [`127.0.0.1:${port}`, `localhost:${port}`, `[::1]:${port}`].includes(h.toLowerCase());
}
function originOk(o) {
  if (o === undefined) return true;
  try {
    const u = new URL(o);
    return ["127.0.0.1", "localhost", "[::1]"].includes(u.hostname);
  } catch {
    return false;
  }
}
// see the head of this file: a header older than the session's version
// is read as the session's (both in headers and rawHeaders: the SDK's
// Node adapter reads the raw ones)
function sessionVersion(req, version) {
  const h = req.headers["mcp-protocol-version"];
  if (!version || h === undefined || !SUPPORTED_PROTOCOL_VERSIONS.includes(h) || h >= version) return;
  req.headers["mcp-protocol-version"] = version;
  for (let i = 0; i + 1 < req.rawHeaders.length; i += 2)
    if (req.rawHeaders[i].toLowerCase() === "mcp-protocol-version") req.rawHeaders[i + 1] = version;
}

async function handleMcp(req, res, body) {
  const sid = req.headers["mcp-session-id"];
  if (sid !== undefined) {
    const s = sessions.get(sid);
    if (!s) return rpcError(res, 404, "Session not found", -32001);
    sessionVersion(req, s.version);
    return s.transport.handleRequest(req, res, body);
  }
  if (req.method === "POST" && isInitializeRequest(body)) {
    const asked = body.params.protocolVersion;
    const version = SUPPORTED_PROTOCOL_VERSIONS.includes(asked) ? asked : LATEST_PROTOCOL_VERSION;
    const mcp = makeServer();
    const transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      eventStore: eventStore(),
      retryInterval: 1000,
      onsessioninitialized: (id) => sessions.set(id, { transport, version }),
    });
    transport.onclose = () => {
      if (transport.sessionId) sessions.delete(transport.sessionId);
      mcp.close().catch(() => {});
    };
    await mcp.connect(transport);
    return transport.handleRequest(req, res, body);
  }
  return rpcError(res, 400, "Bad Request: no valid Mcp-Session-Id");
}

const httpServer = http.createServer(async (req, res) => {
  try {
    const url = new URL(req.url, "http://localhost");
    if (!hostOk(req.headers.host) || !originOk(req.headers.origin))
      return rpcError(res, 403, `Forbidden: Host ${req.headers.host ?? "(none)"} / Origin ${req.headers.origin ?? "(none)"} is not this server`);
    if (url.pathname !== "/mcp") return rpcError(res, 404, `Not found: ${url.pathname}`);
    let body;
    if (req.method === "POST") {
      const chunks = [];
      for await (const c of req) chunks.push(c);
      try {
        body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
      } catch {
        return rpcError(res, 400, "Parse error", -32700);
      }
    }
    await handleMcp(req, res, body);
  } catch (e) {
    console.error(`conformance_server: ${e?.stack ?? e}`);
    if (!res.headersSent) rpcError(res, 500, `Internal error: ${e}`, -32603);
    else res.end();
  }
});

httpServer.listen(Number(opts["--port"] ?? 0), host, () => {
  port = httpServer.address().port;
  if (opts["--port-file"]) {
    fs.writeFileSync(opts["--port-file"] + ".tmp", String(port));
    fs.renameSync(opts["--port-file"] + ".tmp", opts["--port-file"]);
  }
  console.error(`conformance_server: listening on http://${host}:${port}/mcp`);
});
for (const sig of ["SIGTERM", "SIGINT"]) process.on(sig, () => process.exit(0));
