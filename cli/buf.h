/*
** buf.h - the command's growable byte buffer, with a hard cap: the output
** of --lines workers, the records `idem ls` prints, the MCP gateway's
** queues and lines.  It needs nothing but the C library (the fuzz target
** of the MCP messages builds it alone).
*/
#ifndef IDEM_CLI_BUF_H
#define IDEM_CLI_BUF_H

#include <stddef.h>

/* The bytes are always followed by a NUL (not counted in len) once any
** were put, so a line or a record can be read as a C string. */
typedef struct cli_outbuf {
  char *p;      /* the bytes (NULL until the first growth)  */
  size_t len;   /* bytes in use                             */
  size_t alloc; /* bytes allocated                          */
  size_t cap;   /* the most it may ever hold (SIZE_MAX: no cap) */
} cli_outbuf;

void cli_outbuf_init(cli_outbuf *o, size_t cap);
void cli_outbuf_free(cli_outbuf *o);
/* Make room for more bytes past len; nonzero (the contents kept) when the
** cap forbids or memory ran out. */
int cli_outbuf_reserve(cli_outbuf *o, size_t more);
/* Append n bytes at p / the string s; nonzero as for reserve, and then
** nothing is appended. */
int cli_outbuf_put(cli_outbuf *o, const void *p, size_t n);
int cli_outbuf_str(cli_outbuf *o, const char *s);
/* Drop the first n bytes. */
void cli_outbuf_consume(cli_outbuf *o, size_t n);

#endif /* IDEM_CLI_BUF_H */
