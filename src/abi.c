/*
** abi.c - the structs of idem.h that carry their size (the ABI rule in the
** header's conventions).
**
** A caller compiled against this header sets size = sizeof the struct; one
** compiled against a later header sets a larger size, one against an
** earlier a smaller.  The library copies what both know and leaves the
** rest zero (a field this version has and the caller lacks reads as NULL /
** 0); it never reads or writes past the caller's size.  Every sized struct
** has a first layout (idemInt.h: IDEM__ABI_MIN and the named ones for
** structs that grew since); a size below it is misuse.
*/
#include <string.h>

#include "idemInt.h"

int idem__abi_in(void *dst, size_t dsize, const void *src, size_t min) {
  size_t size;
  memset(dst, 0, dsize);
  if (!src) return IDEM_MISUSE;
  memcpy(&size, src, sizeof size);
  if (size < min) return IDEM_MISUSE;
  memcpy(dst, src, size < dsize ? size : dsize);
  return IDEM_OK;
}

int idem__abi_out(void *dst, const void *src, size_t ssize, size_t min) {
  size_t size;
  if (!dst) return IDEM_MISUSE;
  memcpy(&size, dst, sizeof size);
  if (size < min) return IDEM_MISUSE;
  /* everything after the caller's own size field */
  memcpy((char *)dst + sizeof size, (const char *)src + sizeof size,
         (size < ssize ? size : ssize) - sizeof size);
  return IDEM_OK;
}
