/*
** status.c - status codes, their names and sentences, and the version.
**
** The table is IDEM_STATUS_MAP in idem.h; this file only expands it, so a
** new code needs exactly one new line there.
*/
#include "idemInt.h"

const char *idem_strerror(int rc) {
  switch (rc) {
#define IDEM__TEXT(suffix, value, name, text)                                  \
  case value: return text;
    IDEM_STATUS_MAP(IDEM__TEXT)
#undef IDEM__TEXT
  default: return "unknown status";
  }
}

const char *idem_status_name(int rc) {
  switch (rc) {
#define IDEM__NAME(suffix, value, name, text)                                  \
  case value: return name;
    IDEM_STATUS_MAP(IDEM__NAME)
#undef IDEM__NAME
  default: return "unknown";
  }
}

const char *idem_version(void) { return IDEM_VERSION_STRING; }

unsigned idem_version_number(void) { return IDEM_VERSION_NUMBER; }
