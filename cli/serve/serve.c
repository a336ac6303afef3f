/*
** serve.c - `idem serve`: the operator's console over HTTP (docs/CONSOLE.md).
**
** libmicrohttpd serves, a thread per connection; every request goes
** through on_request, which refuses what is not this console's before any
** route runs:
**
**   Host      must name this console (127.0.0.1:PORT, localhost:PORT, the
**             address listened on), unless it listens beyond loopback: a
**             page of another site whose name was made to resolve to
**             127.0.0.1 gets nothing (DNS rebinding).
**   writes    POST only, and only /api/resolve - which --read-only does
**             not have at all.  A write needs, in this order: an Origin,
**             when sent, that is this console's (403); Authorization:
**             Bearer TOKEN, the token printed at start or given in
**             IDEM_SERVE_TOKEN (401); the header X-Idem-CSRF equal to the
**             idem_csrf cookie (403, a double submit: another site can
**             neither read the cookie nor set the header); and a JSON
**             body.  A cross-site form can send none of these.
**
** Every answer carries a Content-Security-Policy that allows this
** console's own script and style files and nothing inline, and the page
** sets every text with textContent: an argument of "<script>" is text.
*/
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "serve.h"

#define MAX_BODY ((size_t)1 << 20) /* a verdict's result is at most 1 MiB */

static const char csp[] =
    "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; connect-src 'self'; form-action 'none'; "
    "frame-ancestors 'none'; base-uri 'none'";

/* ---- answers ---------------------------------------------------------------- */

static enum MHD_Result send_reply(serve *s, struct MHD_Connection *c,
                                  serve_reply *r) {
  struct MHD_Response *resp;
  enum MHD_Result ok;
  char cookie[96];
  if (r->page)
    resp = MHD_create_response_from_buffer(r->len, (void *)r->page,
                                           MHD_RESPMEM_PERSISTENT);
  else if (!r->body && r->len)
    return MHD_NO; /* out of memory: no answer */
  else
    resp = MHD_create_response_from_buffer(
        r->len, r->body ? r->body : (void *)"",
        r->body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
  if (!resp) {
    free(r->body);
    return MHD_NO;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->type);
  MHD_add_response_header(resp, "Content-Security-Policy", csp);
  MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
  MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
  MHD_add_response_header(resp, "X-Frame-Options", "DENY");
  MHD_add_response_header(resp, "Cache-Control", "no-store");
  if (r->set_csrf) {
    snprintf(cookie, sizeof cookie, "idem_csrf=%s; Path=/; SameSite=Strict",
             s->csrf);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_SET_COOKIE, cookie);
  }
  ok = MHD_queue_response(c, r->status, resp);
  MHD_destroy_response(resp);
  return ok;
}

/* ---- what a request must show ----------------------------------------------- */

/* Compare without stopping at the first difference (the token). */
static int same_secret(const char *a, const char *b) {
  size_t n = strlen(a), m = strlen(b), i;
  unsigned char d = n != m;
  for (i = 0; i < n; i++) d |= (unsigned char)(a[i] ^ b[i % (m ? m : 1)]);
  return d == 0;
}

static const char *header(struct MHD_Connection *c, const char *name) {
  return MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);
}

int serve_host_ok(const serve_names *nm, const char *h) {
  int i;
  if (nm->any_host) return 1;
  if (!h) return 0;
  for (i = 0; i < nm->nhosts; i++)
    if (strcmp(h, nm->hosts[i]) == 0) return 1;
  return 0;
}

static int host_ok(serve *s, struct MHD_Connection *c) {
  return serve_host_ok(&s->nm, header(c, MHD_HTTP_HEADER_HOST));
}

/* A write's checks, in order; 0 when it may go on, else out is the
** refusal. */
static int write_ok(serve *s, struct MHD_Connection *c, serve_reply *out) {
  const char *origin = header(c, "Origin");
  const char *host = header(c, MHD_HTTP_HEADER_HOST);
  const char *auth = header(c, MHD_HTTP_HEADER_AUTHORIZATION);
  const char *site = header(c, "Sec-Fetch-Site");
  const char *type = header(c, MHD_HTTP_HEADER_CONTENT_TYPE);
  const char *csrf = header(c, "X-Idem-CSRF");
  const char *cookie = MHD_lookup_connection_value(c, MHD_COOKIE_KIND,
                                                   "idem_csrf");
  char own[320];
  snprintf(own, sizeof own, "http://%s", host ? host : "");
  if ((origin && strcmp(origin, own) != 0) ||
      (site && strcmp(site, "same-origin") != 0 && strcmp(site, "none") != 0)) {
    serve_error(out, 403, "refused: a write from another origin (%s)",
                origin ? origin : site);
    return -1;
  }
  if (!auth || strncmp(auth, "Bearer ", 7) != 0 ||
      !same_secret(auth + 7, s->token)) {
    serve_error(out, 401,
                "refused: %s (the token idem serve printed at start, or "
                "IDEM_SERVE_TOKEN)",
                auth ? "the token is wrong" : "a write needs the token");
    return -1;
  }
  if (!csrf || !cookie || strcmp(csrf, cookie) != 0 ||
      !same_secret(csrf, s->csrf)) {
    serve_error(out, 403,
                "refused: the CSRF check failed (reload the page: the "
                "X-Idem-CSRF header must equal the idem_csrf cookie)");
    return -1;
  }
  if (!type || strncmp(type, "application/json", 16) != 0) {
    serve_error(out, 415, "a write's body is JSON (Content-Type: "
                          "application/json)");
    return -1;
  }
  return 0;
}

/* ---- requests --------------------------------------------------------------- */

/* One request's body, gathered over the calls of on_request. */
typedef struct request {
  cli_outbuf body;
  int too_big;
} request;

static void answer_get(serve *s, struct MHD_Connection *c, const char *url,
                       serve_reply *out) {
  const serve_asset *a;
  if (strncmp(url, "/api/", 5) == 0) {
    serve_api(s, c, "GET", url + 5, NULL, 0, out);
    return;
  }
  if (strcmp(url, "/metrics") == 0) {
    serve_metrics(s, out);
    return;
  }
  if (strcmp(url, "/index.html") == 0) url = "/";
  for (a = serve_assets; a->path; a++)
    if (strcmp(url, a->path) == 0) {
      out->status = 200;
      out->type = a->type;
      out->page = a->data; /* the embedded bytes, sent as they are */
      out->len = a->len;
      return;
    }
  serve_error(out, 404, "no page %s", url);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c,
                                  const char *url, const char *method,
                                  const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
  serve *s = cls;
  request *rq = *con_cls;
  serve_reply out = {500, "application/json", NULL, NULL, 0, 0};
  int post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
  (void)version;
  if (!rq) { /* the headers are in: the body, if any, comes next */
    if (!(rq = calloc(1, sizeof *rq))) return MHD_NO;
    cli_outbuf_init(&rq->body, MAX_BODY);
    *con_cls = rq;
    return MHD_YES;
  }
  if (*upload_size) {
    if (cli_outbuf_put(&rq->body, upload, *upload_size)) rq->too_big = 1;
    *upload_size = 0;
    return MHD_YES;
  }
  if (!host_ok(s, c)) {
    const char *host = header(c, MHD_HTTP_HEADER_HOST);
    serve_error(&out, 403, "refused: Host %s does not name this console",
                host ? host : "(none)");
  } else if (strcmp(url, "/api/resolve") == 0 && !s->read_only) {
    if (!post)
      serve_error(&out, 405, "/api/resolve takes a POST");
    else if (write_ok(s, c, &out) == 0) {
      if (rq->too_big)
        serve_error(&out, 413, "the body is larger than %zu bytes", MAX_BODY);
      else
        serve_api(s, c, "POST", url + 5, rq->body.p ? rq->body.p : "",
                  rq->body.len, &out);
    }
  } else if (strcmp(method, MHD_HTTP_METHOD_GET) == 0 ||
             strcmp(method, MHD_HTTP_METHOD_HEAD) == 0) {
    answer_get(s, c, url, &out);
  } else if (post) {
    serve_error(&out, 404, "no write route %s%s", url,
                s->read_only ? " (idem serve --read-only)" : "");
  } else {
    serve_error(&out, 405, "%s is not served", method);
  }
  return send_reply(s, c, &out);
}

static void on_done(void *cls, struct MHD_Connection *c, void **con_cls,
                    enum MHD_RequestTerminationCode how) {
  request *rq = *con_cls;
  (void)cls;
  (void)c;
  (void)how;
  if (rq) {
    cli_outbuf_free(&rq->body);
    free(rq);
  }
  *con_cls = NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
  (void)cls;
  (void)fmt;
  (void)ap; /* a peer that went away mid-answer is not news */
}

/* ---- start ------------------------------------------------------------------ */

static int random_hex(char *out, size_t bytes) {
  unsigned char r[64];
  if (bytes > sizeof r || getrandom(r, bytes, 0) != (ssize_t)bytes) return -1;
  cli_hex(r, bytes, out);
  return 0;
}

/* --listen HOST:PORT ([V6]:PORT) into host and port. */
static int split_listen(const char *arg, char *host, size_t n,
                        const char **port) {
  const char *colon = strrchr(arg, ':');
  size_t len;
  if (!colon || !colon[1]) return -1;
  len = (size_t)(colon - arg);
  if (len && arg[0] == '[' && arg[len - 1] == ']') {
    arg++;
    len -= 2;
  }
  if (!len || len >= n) return -1;
  memcpy(host, arg, len);
  host[len] = '\0';
  *port = colon + 1;
  return 0;
}

static int is_loopback(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) ==
           127;
  return sa->sa_family == AF_INET6 &&
         IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)sa)->sin6_addr);
}

/* The names of a socket: any_host beyond loopback, else the address as
** given and loopback's names, each with the port. */
static void name_hosts(serve_names *nm, const char *host, int v6,
                       unsigned port, int loopback) {
  nm->any_host = !loopback;
  nm->nhosts = 0;
  nm->port = port;
  snprintf(nm->hosts[nm->nhosts++], sizeof nm->hosts[0], "%s%.256s%s:%u",
           v6 ? "[" : "", host, v6 ? "]" : "", port);
  snprintf(nm->hosts[nm->nhosts++], sizeof nm->hosts[0], "localhost:%u", port);
  snprintf(nm->hosts[nm->nhosts++], sizeof nm->hosts[0], "127.0.0.1:%u", port);
  snprintf(nm->hosts[nm->nhosts++], sizeof nm->hosts[0], "[::1]:%u", port);
  snprintf(nm->origin, sizeof nm->origin, "http://%.280s", nm->hosts[0]);
}

/* A socket listening on ai, and its port; -1 with errno. */
static int bind_listen(const struct addrinfo *ai, unsigned *port) {
  struct sockaddr_storage at;
  socklen_t len = sizeof at;
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), on = 1;
  if (fd < 0) return -1;
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0 ||
      (ai->ai_family == AF_INET6 &&
       setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof on) != 0) ||
      bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0 ||
      getsockname(fd, (struct sockaddr *)&at, &len) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  *port = ntohs(at.ss_family == AF_INET6
                    ? ((struct sockaddr_in6 *)&at)->sin6_port
                    : ((struct sockaddr_in *)&at)->sin_port);
  return fd;
}

int serve_bind(const char *cmd, const char *listen, serve_names *nm, int *v6) {
  char host[256];
  const char *port;
  struct addrinfo hints, *ai = NULL;
  unsigned bound;
  int rc, fd;
  if (split_listen(listen, host, sizeof host, &port) != 0) {
    cli_usage(cmd, "--listen is HOST:PORT, not '%s'", listen);
    return -1;
  }
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  if ((rc = getaddrinfo(host, port, &hints, &ai)) != 0) {
    cli_err("--listen %s: %s", listen, gai_strerror(rc));
    return -1;
  }
  if ((fd = bind_listen(ai, &bound)) < 0) {
    cli_err("cannot listen on %s: %s", listen, strerror(errno));
    freeaddrinfo(ai);
    return -1;
  }
  *v6 = ai->ai_family == AF_INET6;
  name_hosts(nm, host, *v6, bound, is_loopback(ai->ai_addr));
  freeaddrinfo(ai);
  return fd;
}

/* Listen on HOST:PORT.  The socket is bound here, and the console's names
** made, before the daemon's threads start: a request that comes at once
** finds them (libmicrohttpd closes the socket when it stops). */
static struct MHD_Daemon *listen_on(serve *s, const char *listen) {
  struct MHD_Daemon *d;
  unsigned flags = MHD_USE_THREAD_PER_CONNECTION |
                   MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                   MHD_USE_ERROR_LOG;
  int fd, v6;
  if ((fd = serve_bind("serve", listen, &s->nm, &v6)) < 0) return NULL;
  if (v6) flags |= MHD_USE_IPv6;
  d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s,
                       MHD_OPTION_LISTEN_SOCKET, fd,
                       MHD_OPTION_NOTIFY_COMPLETED, on_done, NULL,
                       MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
                       MHD_OPTION_CONNECTION_LIMIT, (unsigned)64,
                       MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30,
                       MHD_OPTION_END);
  if (!d) {
    cli_err("cannot serve on %s: libmicrohttpd refused", listen);
    close(fd);
  }
  return d;
}

/* A log given as a path (sqlite:PATH or a plain one) that does not exist:
** the console would make an empty log there and show nothing. */
static int missing_file(const char *log) {
  struct stat st;
  const char *path = log;
  if (!log) return 0;
  if (strncmp(log, "sqlite:", 7) == 0)
    path = log + 7;
  else if (strstr(log, "://") || strchr(log, '='))
    return 0; /* PostgreSQL */
  return *path && stat(path, &st) != 0;
}

/* The token: IDEM_SERVE_TOKEN, or 16 random bytes in hex.  0, or -1
** after one error line (usage: *usage set). */
static int make_secrets(serve *s, int *usage) {
  const char *given = getenv("IDEM_SERVE_TOKEN");
  size_t n = given ? strlen(given) : 0;
  *usage = n && ((!s->read_only && n < 16) || n >= sizeof s->token);
  if (*usage) {
    cli_usage("serve", "IDEM_SERVE_TOKEN has %zu characters: give 16 to "
                       "%zu", n, sizeof s->token - 1);
    return -1;
  }
  if (random_hex(s->csrf, 16) != 0 ||
      (!n && random_hex(s->token, 16) != 0)) {
    cli_err("no random bytes for the token: %s", strerror(errno));
    return -1;
  }
  if (n) {
    snprintf(s->token, sizeof s->token, "%s", given);
    s->token_given = 1;
  }
  return 0;
}

serve *serve_start(const serve_options *o, int *usage) {
  serve *s = calloc(1, sizeof *s);
  *usage = 0;
  if (!s) {
    cli_err("out of memory");
    return NULL;
  }
  s->read_only = o->read_only;
  if (make_secrets(s, usage) != 0) goto fail;
  if (o->policy && idem_policy_load(o->policy, &s->policy) != IDEM_OK) {
    cli_err("%s: %s", o->policy,
            s->policy ? idem_policy_errmsg(s->policy) : "out of memory");
    goto fail;
  }
  if (missing_file(o->log)) {
    cli_err("no attempt log at %s", o->log);
    goto fail;
  }
  if (idem_guard_open(o->log, NULL, &s->g) != IDEM_OK) {
    cli_err("%s", s->g ? idem_guard_errmsg(s->g) : "out of memory");
    goto fail;
  }
  idem_log_shown(idem_guard_log(s->g), s->log, sizeof s->log);
  if (!(s->d = listen_on(s, o->listen ? o->listen : "127.0.0.1:8787")))
    goto fail;
  return s;
fail:
  serve_stop(s);
  return NULL;
}

void serve_announce(const serve *s, FILE *f) {
  fprintf(f, "idem serve: %s/ (log %s)\n", s->nm.origin, s->log);
  if (s->read_only)
    fprintf(f, "idem serve: read-only, no writes\n");
  else
    fprintf(f, "idem serve: token %s\n",
            s->token_given ? "from IDEM_SERVE_TOKEN" : s->token);
  fflush(f);
}

void serve_stop(serve *s) {
  if (!s) return;
  if (s->d) MHD_stop_daemon(s->d);
  idem_guard_close(s->g);
  idem_policy_free(s->policy);
  free(s);
}

int cmd_serve(int argc, char **argv) {
  static const struct option opts[] = {
      {"log", required_argument, NULL, 'L'},
      {"policy", required_argument, NULL, 'p'},
      {"listen", required_argument, NULL, 'l'},
      {"read-only", no_argument, NULL, 'r'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  serve_options o = {NULL, NULL, "127.0.0.1:8787", 0};
  serve *s;
  sigset_t stop;
  int ch, sig = 0, usage;
  while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (ch) {
    case 'L': o.log = optarg; break;
    case 'p': o.policy = optarg; break;
    case 'l': o.listen = optarg; break;
    case 'r': o.read_only = 1; break;
    case 'h': cli_print_usage(stdout, "serve"); return cli_flush();
    case ':':
      return cli_usage("serve", "option '%s' needs a value", argv[optind - 1]);
    default:
      return cli_usage("serve", "no option '%s' for serve", argv[optind - 1]);
    }
  }
  if (optind < argc) return cli_usage("serve", "too many arguments");
  /* every thread inherits the blocked stop signals; this one waits */
  signal(SIGPIPE, SIG_IGN);
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, NULL);
  if (!(s = serve_start(&o, &usage))) return usage ? EXIT_USAGE : EXIT_FAIL;
  serve_announce(s, stdout);
  sigwait(&stop, &sig);
  serve_stop(s);
  return EXIT_OK;
}
