// What the hand-written MCP servers of the tests share (raw_server.mjs,
// wall_server.mjs, suggest_raw_server.mjs): JSON lines on stdin and stdout
// (readLines, send), and the handshake.
// serve() answers initialize, ping and tools/list itself, any other request
// but tools/call with -32601, and hands every tools/call (a notification
// too) to call(m); onLine(line) sees each line first.
export const send = (m) => process.stdout.write(JSON.stringify(m) + "\n");

// fn(line) for every line of stdin (without its newline).
export function readLines(fn) {
  let buf = "";
  process.stdin.on("data", (d) => {
    buf += d;
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      fn(line);
    }
  });
}

export function serve({ name, tools, call, onLine = () => {} }) {
  readLines((line) => {
    onLine(line);
    handle(JSON.parse(line));
  });
  function handle(m) {
    if (m.method === "initialize")
      return send({ jsonrpc: "2.0", id: m.id, result: { protocolVersion: m.params.protocolVersion,
        capabilities: { tools: {} }, serverInfo: { name, version: "1" } } });
    if (m.method === "ping") return send({ jsonrpc: "2.0", id: m.id, result: {} });
    if (m.method === "tools/list") return send({ jsonrpc: "2.0", id: m.id, result: { tools } });
    if (m.method !== "tools/call") {
      if (m.id !== undefined) send({ jsonrpc: "2.0", id: m.id, error: { code: -32601, message: "no such method" } });
      return;
    }
    call(m);
  }
}
