// A small OAuth 2.1 authorization server of the tests' own: just enough for
// the official MCP SDK client's own discovery and authorization flow
// (client/auth.js of @modelcontextprotocol/sdk), and for a resource server
// (http_payments_server.mjs --oauth) to check the tokens it issued.
//
//   node oauth_server.mjs [--host 127.0.0.1] [--port 0] [--port-file FILE] [--log FILE]
//
// The issuer is http://HOST:PORT (no path), so the SDK finds
//   GET  /.well-known/oauth-authorization-server  RFC 8414 metadata
//   POST /register    RFC 7591 dynamic client registration (public clients,
//                     token_endpoint_auth_method "none", unless another is
//                     asked for: then a client_secret too)
//   GET  /authorize   authorization code + PKCE (S256 only); nobody is asked:
//                     a known client and a registered redirect_uri get a 302
//                     to redirect_uri?code=...&state=... at once
//   POST /token       grant_type authorization_code (code_verifier checked
//                     against the challenge, redirect_uri, client and the
//                     RFC 8707 resource the code was issued for) and
//                     refresh_token; the access token's audience is that
//                     resource
//   POST /introspect  RFC 7662: {active, aud, client_id, scope, exp, ...};
//                     the resource server asks it about a bearer token
// --log FILE gets one JSON line per request: {method, path, status, ...}.
// The port is written to --port-file once it listens (and on stderr).
import fs from "node:fs";
import http from "node:http";
import crypto from "node:crypto";
import { fileURLToPath } from "node:url";

const rand = (n = 24) => crypto.randomBytes(n).toString("base64url");
const s256 = (v) => crypto.createHash("sha256").update(v).digest("base64url");

async function readBody(req) {
  const chunks = [];
  for await (const c of req) chunks.push(c);
  return Buffer.concat(chunks).toString("utf8");
}

// Starts the server; resolves to { url, port, server, close(), issued() }.
export async function startOAuthServer({ host = "127.0.0.1", port = 0, log } = {}) {
  const clients = new Map(); // client_id -> registration
  const codes = new Map(); // code -> { client_id, challenge, redirect_uri, resource, scope, exp }
  const tokens = new Map(); // access token -> { client_id, aud, scope, exp }
  const refreshes = new Map(); // refresh token -> { client_id, aud, scope }
  let issuer;

  const note = (o) => { if (log) fs.appendFileSync(log, JSON.stringify({ t: Date.now(), ...o }) + "\n"); };

  function metadata() {
    return {
      issuer,
      authorization_endpoint: `${issuer}/authorize`,
      token_endpoint: `${issuer}/token`,
      registration_endpoint: `${issuer}/register`,
      introspection_endpoint: `${issuer}/introspect`,
      response_types_supported: ["code"],
      grant_types_supported: ["authorization_code", "refresh_token"],
      code_challenge_methods_supported: ["S256"],
      token_endpoint_auth_methods_supported: ["none", "client_secret_post", "client_secret_basic"],
      scopes_supported: ["payments"],
    };
  }

  function issue(client_id, aud, scope) {
    const access_token = "at_" + rand();
    const refresh_token = "rt_" + rand();
    const exp = Math.floor(Date.now() / 1000) + 3600;
    tokens.set(access_token, { client_id, aud, scope, exp });
    refreshes.set(refresh_token, { client_id, aud, scope });
    return { access_token, token_type: "Bearer", expires_in: 3600, refresh_token, ...(scope ? { scope } : {}) };
  }

  // The client of a token request: client_secret_basic, else the form's
  // client_id (+ client_secret).  null when it does not authenticate.
  function tokenClient(req, form) {
    let id = form.get("client_id"), secret = form.get("client_secret");
    const a = req.headers.authorization;
    if (a?.startsWith("Basic ")) {
      const [u, p] = Buffer.from(a.slice(6), "base64").toString("utf8").split(":");
      id = decodeURIComponent(u);
      secret = decodeURIComponent(p ?? "");
    }
    const c = id && clients.get(id);
    if (!c) return null;
    if (c.client_secret && c.client_secret !== secret) return null;
    return c;
  }

  const server = http.createServer(async (req, res) => {
    const url = new URL(req.url, issuer);
    const send = (status, obj, headers = {}) => {
      note({ method: req.method, path: url.pathname, status, ...(obj?.error ? { error: obj.error } : {}) });
      res.writeHead(status, { "content-type": "application/json", "cache-control": "no-store", ...headers });
      res.end(obj === undefined ? "" : JSON.stringify(obj));
    };
    const oauthError = (status, error, error_description) => send(status, { error, error_description });
    try {
      if (req.method === "GET" && url.pathname === "/.well-known/oauth-authorization-server")
        return send(200, metadata());

      if (req.method === "POST" && url.pathname === "/register") {
        let m;
        try { m = JSON.parse(await readBody(req)); } catch { return oauthError(400, "invalid_client_metadata", "not JSON"); }
        if (!Array.isArray(m.redirect_uris) || m.redirect_uris.length === 0 ||
            !m.redirect_uris.every((u) => typeof u === "string" && URL.canParse(u)))
          return oauthError(400, "invalid_redirect_uri", "redirect_uris: a non-empty array of URLs");
        const method = m.token_endpoint_auth_method ?? "none";
        if (!metadata().token_endpoint_auth_methods_supported.includes(method))
          return oauthError(400, "invalid_client_metadata", `token_endpoint_auth_method ${method}`);
        const c = {
          ...m,
          client_id: "client_" + rand(9),
          client_id_issued_at: Math.floor(Date.now() / 1000),
          token_endpoint_auth_method: method,
          grant_types: m.grant_types ?? ["authorization_code", "refresh_token"],
          response_types: m.response_types ?? ["code"],
          ...(method === "none" ? {} : { client_secret: rand(), client_secret_expires_at: 0 }),
        };
        clients.set(c.client_id, c);
        return send(201, c);
      }

      if (req.method === "GET" && url.pathname === "/authorize") {
        const q = url.searchParams;
        const c = clients.get(q.get("client_id") ?? "");
        const redirect = q.get("redirect_uri");
        // errors before the redirect_uri is known good are never redirected
        if (!c) return oauthError(400, "invalid_client", "unknown client_id");
        if (!redirect || !c.redirect_uris.includes(redirect))
          return oauthError(400, "invalid_request", "redirect_uri is not registered for this client");
        const back = new URL(redirect);
        const state = q.get("state");
        if (state !== null) back.searchParams.set("state", state);
        const fail = (error, d) => {
          back.searchParams.set("error", error);
          back.searchParams.set("error_description", d);
          note({ method: req.method, path: url.pathname, status: 302, error });
          res.writeHead(302, { location: back.href });
          res.end();
        };
        if (q.get("response_type") !== "code") return fail("unsupported_response_type", "only code");
        if (q.get("code_challenge_method") !== "S256" || !q.get("code_challenge"))
          return fail("invalid_request", "PKCE with S256 is required");
        const resource = q.get("resource");
        if (resource !== null && !URL.canParse(resource)) return fail("invalid_target", "resource is not a URL");
        const code = "code_" + rand();
        codes.set(code, { client_id: c.client_id, challenge: q.get("code_challenge"), redirect_uri: redirect,
                          resource, scope: q.get("scope"), exp: Date.now() + 60000 });
        back.searchParams.set("code", code);
        note({ method: req.method, path: url.pathname, status: 302, client_id: c.client_id, resource });
        res.writeHead(302, { location: back.href });
        return res.end();
      }

      if (req.method === "POST" && url.pathname === "/token") {
        const form = new URLSearchParams(await readBody(req));
        const c = tokenClient(req, form);
        if (!c) return oauthError(401, "invalid_client", "client authentication failed");
        const grant = form.get("grant_type");
        if (grant === "authorization_code") {
          const code = form.get("code");
          const k = codes.get(code ?? "");
          codes.delete(code); // used once, whatever follows
          if (!k || k.exp < Date.now() || k.client_id !== c.client_id)
            return oauthError(400, "invalid_grant", "unknown, used or expired code");
          if (form.get("redirect_uri") !== k.redirect_uri)
            return oauthError(400, "invalid_grant", "redirect_uri differs from the authorization request's");
          const verifier = form.get("code_verifier");
          if (!verifier || s256(verifier) !== k.challenge)
            return oauthError(400, "invalid_grant", "code_verifier does not match the code_challenge");
          const resource = form.get("resource") ?? k.resource;
          if (k.resource !== null && resource !== k.resource)
            return oauthError(400, "invalid_target", "resource differs from the authorization request's");
          const t = issue(c.client_id, resource, k.scope);
          note({ method: req.method, path: url.pathname, status: 200, grant, client_id: c.client_id, aud: resource });
          res.writeHead(200, { "content-type": "application/json", "cache-control": "no-store" });
          return res.end(JSON.stringify(t));
        }
        if (grant === "refresh_token") {
          const r = refreshes.get(form.get("refresh_token") ?? "");
          if (!r || r.client_id !== c.client_id) return oauthError(400, "invalid_grant", "unknown refresh_token");
          const resource = form.get("resource") ?? r.aud;
          if (r.aud !== null && resource !== r.aud) return oauthError(400, "invalid_target", "resource differs");
          const t = issue(c.client_id, resource, r.scope);
          note({ method: req.method, path: url.pathname, status: 200, grant, client_id: c.client_id, aud: resource });
          res.writeHead(200, { "content-type": "application/json", "cache-control": "no-store" });
          return res.end(JSON.stringify(t));
        }
        return oauthError(400, "unsupported_grant_type", String(grant));
      }

      if (req.method === "POST" && url.pathname === "/introspect") {
        const form = new URLSearchParams(await readBody(req));
        const t = tokens.get(form.get("token") ?? "");
        if (!t || t.exp < Date.now() / 1000) return send(200, { active: false });
        return send(200, { active: true, token_type: "Bearer", client_id: t.client_id, aud: t.aud,
                           ...(t.scope ? { scope: t.scope } : {}), exp: t.exp, iss: issuer });
      }

      return send(404, { error: "not_found", error_description: `${req.method} ${url.pathname}` });
    } catch (e) {
      return send(500, { error: "server_error", error_description: String(e) });
    }
  });

  await new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, resolve);
  });
  const actual = server.address().port;
  issuer = `http://${host}:${actual}`;
  return {
    url: issuer,
    port: actual,
    server,
    issued: () => [...tokens.values()],
    close: () => new Promise((r) => { server.closeAllConnections?.(); server.close(() => r()); }),
  };
}

if (process.argv[1] && fileURLToPath(import.meta.url) === fs.realpathSync(process.argv[1])) {
  const a = process.argv.slice(2);
  const opt = (name) => { const i = a.indexOf(name); return i >= 0 ? a[i + 1] : undefined; };
  const s = await startOAuthServer({ host: opt("--host") ?? "127.0.0.1", port: Number(opt("--port") ?? 0),
                                     log: opt("--log") });
  const pf = opt("--port-file");
  if (pf) { fs.writeFileSync(pf + ".tmp", String(s.port)); fs.renameSync(pf + ".tmp", pf); }
  console.error(`oauth_server: issuer ${s.url}`);
  for (const sig of ["SIGTERM", "SIGINT"]) process.on(sig, () => process.exit(0));
}
