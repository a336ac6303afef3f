"""The binding's tables against include/idem.h, read at test time: every
status code of IDEM_STATUS_MAP has its exception class with the same code
and name (and no class names a code the header lacks); the answers,
states, resolutions, outcomes, next steps, tool classes and canonicalizer
limits are the header's enums, value for value; and the library loaded
names them the same way.  A code added to (or renumbered in) the header
and not to the binding fails here."""
import os
import re
import unittest

from tests.support import idem, REPO
from idem import _aio, _lib, core, errors, guard

HEADER = os.path.join(REPO, "include", "idem.h")


def read_header():
    with open(HEADER, encoding="utf-8") as f:
        return f.read()


def status_map(text):
    """IDEM_STATUS_MAP's rows: [(SUFFIX, value, name)]."""
    block = text[text.index("#define IDEM_STATUS_MAP(X)"):]
    block = block[:block.index("typedef enum idem_status")]
    rows = re.findall(r'X\((\w+),\s*(\d+),\s*"([^"]*)"', block)
    return [(s, int(v), n) for s, v, n in rows]


def enum(text, name):
    """enum NAME's members: {MEMBER: value}."""
    m = re.search(r"enum %s\s*\{(.*?)\}" % name, text, re.S)
    if not m:
        raise AssertionError("no enum %s in %s" % (name, HEADER))
    body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
    return {k: int(v) for k, v in re.findall(r"(IDEM_\w+)\s*=\s*(\d+)", body)}


def define(text, name):
    m = re.search(r"#define %s\s+(.+)" % name, text)
    if not m:
        raise AssertionError("no #define %s in %s" % (name, HEADER))
    expr = re.sub(r"/\*.*", "", m.group(1)).strip()
    expr = re.sub(r"(\d+)u\b", r"\1", expr)
    if not re.fullmatch(r"[\d\s()*+]+", expr):
        raise AssertionError("cannot read %s = %s" % (name, expr))
    return eval(expr)


def struct_fields(text, name):
    """The member names of ``typedef struct NAME {...} NAME;``, in order."""
    m = re.search(r"typedef struct %s\s*\{(.*?)\}\s*%s;" % (name, name),
                  text, re.S)
    if not m:
        raise AssertionError("no struct %s in %s" % (name, HEADER))
    body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
    names = []
    for decl in body.split(";"):
        decl = " ".join(decl.split())
        if not decl:
            continue
        fp = re.search(r"\(\*\s*(\w+)\)", decl)  # a function pointer
        if fp:
            names.append(fp.group(1))
            continue
        for part in decl.split(","):
            part = re.sub(r"\[[^]]*\]", "", part)  # an array's length
            names.append(re.findall(r"\w+", part)[-1])
    return names


def by_suffix(members, prefix):
    """{value: suffix in lower case} of the members named PREFIX_SUFFIX."""
    return {v: k[len(prefix):].lower() for k, v in members.items()
            if k.startswith(prefix)}


class Header(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.text = read_header()

    def test_status_codes_and_exceptions(self):
        rows = status_map(self.text)
        self.assertGreater(len(rows), 20)
        header = {v: (s, n) for s, v, n in rows}
        self.assertEqual(header[0], ("OK", "ok"))
        self.assertEqual((idem.IdemError.code, idem.IdemError.name),
                         (1, header[1][1]))
        for value, (suffix, name) in header.items():
            if value in (0, 1):
                continue
            with self.subTest(code="IDEM_" + suffix):
                self.assertIn(value, errors._BY_CODE,
                              "IDEM_%s (%d) has no exception class"
                              % (suffix, value))
                cls = errors._BY_CODE[value]
                self.assertEqual((cls.code, cls.name), (value, name))
                self.assertIsInstance(errors.error_for(value, "x"), cls)
                # and the library loaded says the same
                self.assertEqual(_lib.status_name(value).decode(), name)
        for value, cls in errors._BY_CODE.items():
            self.assertIn(value, header, "%s names code %d, which "
                          "idem.h does not have" % (cls.__name__, value))
            self.assertIn(cls.__name__, idem.__all__)
        # the JSON errors are JSONErrors, the log's StoreErrors
        for value, (suffix, _) in header.items():
            if suffix.startswith("JSON_") or suffix == "NOT_OBJECT":
                self.assertTrue(issubclass(errors._BY_CODE[value],
                                           idem.JSONError), suffix)
        for suffix in ("BUSY", "CORRUPT"):
            value = [v for v, (s, _) in header.items() if s == suffix][0]
            self.assertTrue(issubclass(errors._BY_CODE[value],
                                       idem.StoreError))
        self.assertEqual(guard._INVALID, [v for v, (s, _) in header.items()
                                          if s == "INVALID"][0])
        self.assertEqual(guard._NOTFOUND, [v for v, (s, _) in header.items()
                                           if s == "NOTFOUND"][0])

    def test_answers(self):
        want = by_suffix(enum(self.text, "idem_answer"), "IDEM_ANSWER_")
        self.assertEqual(guard.ANSWERS, want)
        for v, name in want.items():
            self.assertEqual(_lib.answer_name(v).decode(), name)

    def test_states(self):
        want = by_suffix(enum(self.text, "idem_state"), "IDEM_STATE_")
        self.assertEqual(guard.STATES, want)
        for v, name in want.items():
            self.assertEqual(_lib.state_name(v).decode(), name)

    def test_resolutions(self):
        want = by_suffix(enum(self.text, "idem_resolution"),
                         "IDEM_RESOLVED_")
        self.assertEqual(want.pop(0), "none")
        got = dict(guard.RESOLUTIONS)
        self.assertIsNone(got.pop(0))
        self.assertEqual(got, want)
        for v, name in want.items():
            self.assertEqual(_lib.resolution_name(v).decode(), name)

    def test_outcomes(self):
        members = enum(self.text, "idem_outcome")
        self.assertEqual({o.name: o.value for o in idem.Outcome},
                         {k[len("IDEM_OUTCOME_"):]: v
                          for k, v in members.items()})
        self.assertEqual(idem.Rejected.outcome,
                         members["IDEM_OUTCOME_REJECTED"])
        self.assertEqual(idem.NotApplied.outcome,
                         members["IDEM_OUTCOME_NOT_APPLIED"])
        self.assertEqual(_aio._UNKNOWN, members["IDEM_OUTCOME_UNKNOWN"])
        for name in ("APPLIED", "REJECTED", "NOT_APPLIED", "UNKNOWN"):
            self.assertEqual(getattr(idem, name),
                             members["IDEM_OUTCOME_" + name])

    def test_next_steps(self):
        members = enum(self.text, "idem_next")
        self.assertEqual({n.name: n.value for n in idem.Next},
                         {k[len("IDEM_NEXT_"):]: v
                          for k, v in members.items()})
        self.assertEqual((_aio._ANSWER, _aio._EXECUTE, _aio._CHECK,
                          _aio._WAIT),
                         (members["IDEM_NEXT_ANSWER"],
                          members["IDEM_NEXT_EXECUTE"],
                          members["IDEM_NEXT_CHECK"],
                          members["IDEM_NEXT_WAIT"]))

    def test_the_queue(self):
        # asyncio's path: the completion's layout and the flags
        self.assertEqual([f for f, _ in _lib.Completion._fields_],
                         struct_fields(self.text, "idem_completion"))
        self.assertEqual(_aio.DELIVER, define(self.text,
                                              "IDEM_QUEUE_DELIVER"))
        self.assertEqual(_aio.ENDED, define(self.text, "IDEM_QUEUE_ENDED"))
        self.assertEqual(_aio.INLINE, define(self.text, "IDEM_QUEUE_INLINE"))

    def test_tool_classes(self):
        want = by_suffix(enum(self.text, "idem_class"), "IDEM_CLASS_")
        self.assertEqual(core.CLASSES, want)

    def test_canonicalizer_limits(self):
        members = enum(self.text, "idem_limit")
        self.assertEqual(core.LIMIT_DEPTH, members["IDEM_LIMIT_DEPTH"])
        self.assertEqual(core.LIMIT_BYTES, members["IDEM_LIMIT_BYTES"])
        self.assertEqual(core.DEFAULT_MAX_DEPTH,
                         define(self.text, "IDEM_DEFAULT_MAX_DEPTH"))
        self.assertEqual(core.DEFAULT_MAX_BYTES,
                         define(self.text, "IDEM_DEFAULT_MAX_BYTES"))

    def test_the_structs_the_binding_fills(self):
        # the sized structs handed to C, member for member (a member added
        # to the header and not here is read by C past what we pass, or
        # not at all), and the idem_call packed by hand on the replay's
        # path as long as the struct
        for cname, cls in (("idem_call", _lib.Call),
                           ("idem_keyspec", _lib.KeySpec),
                           ("idem_tool", _lib.Tool),
                           ("idem_settlement", _lib.Settlement)):
            with self.subTest(struct=cname):
                self.assertEqual([f for f, _ in cls._fields_],
                                 struct_fields(self.text, cname))
        # the counters the library fills, member for member
        self.assertEqual([f for f, _ in _lib.Metrics._fields_],
                         struct_fields(self.text, "idem_metrics"))
        self.assertEqual(_lib.LATENCY_BUCKETS,
                         define(self.text, "IDEM_LATENCY_BUCKETS"))
        # and the record the library fills, read field by field
        self.assertEqual([f for f, _ in _lib.Record._fields_],
                         struct_fields(self.text, "idem_record"))
        self.assertEqual(len(guard._pack_call(*[0] * 8)),
                         guard._CALL_SIZE)
        self.assertEqual(struct_fields(
            "typedef struct x { size_t size; /* a, b */ int (*run)(void *c,"
            " int n); const char *a, *b; } x;", "x"),
            ["size", "run", "a", "b"])
        self.assertEqual(struct_fields(
            "typedef struct y { long long v[9]; int n[X_N], m; } y;", "y"),
            ["v", "n", "m"])

    def test_the_parser_reads_what_it_should(self):
        # the parser itself: a header with a code the binding lacks fails
        text = self.text.replace(
            'X(STALE, 45, "stale", "a stale fencing token")',
            'X(STALE, 45, "stale", "a stale fencing token")                 '
            '\\\n  X(NEW_ONE, 46, "new_one", "a code from the future")')
        self.assertIn((("NEW_ONE", 46, "new_one")), status_map(text))
        self.assertNotIn(46, errors._BY_CODE)
        self.assertEqual(enum("enum idem_x {\n  IDEM_X_A = 1, /* a */\n"
                              "  IDEM_X_B = 2 /* b = 3 */\n};", "idem_x"),
                         {"IDEM_X_A": 1, "IDEM_X_B": 2})


if __name__ == "__main__":
    unittest.main()
