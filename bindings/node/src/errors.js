// Error classes, one per status code of include/idem.h (IDEM_STATUS_MAP;
// checked against the header by test/header.test.js).
//
// Every failure of the library reaches JS as an IdemError carrying `code`
// (the C status), `name` (its short name, as idem_status_name gives it) and
// a message saying what went wrong and where.  What the model should read
// (a refusal, a conflict, an outcome in doubt) is never thrown: it is the
// envelope that Tool.call returns.

export class IdemError extends Error {
  static code = 1;
  static status = 'error';
  constructor(message, code) {
    super(`idem: ${message}`);
    this.code = code ?? new.target.code;
    this.status = new.target.status;
    this.name = new.target.name;
  }
}

/** libidem could not be found or loaded (not a C status). */
export class LibraryNotFound extends IdemError {
  static code = -1;
  static status = 'library';
}

const table = [
  // [class name, code, status name]: IDEM_STATUS_MAP less OK and ERROR
  ['NoMemoryError', 2, 'nomem'],
  ['MisuseError', 3, 'misuse'],
  ['InvalidError', 4, 'invalid'],
  ['IdemRangeError', 5, 'range'],
  ['IOError', 6, 'io'],
  ['JSONSyntaxError', 20, 'syntax'],
  ['TrailingBytesError', 21, 'trailing'],
  ['UTF8Error', 22, 'utf8'],
  ['SurrogateError', 23, 'surrogate'],
  ['DuplicateMemberError', 24, 'duplicate'],
  ['NumberOverflowError', 25, 'overflow'],
  ['NumberUnderflowError', 26, 'underflow'],
  ['BigIntError', 27, 'bigint'],
  ['DepthError', 28, 'depth'],
  ['TooBigError', 29, 'too_big'],
  ['BOMError', 30, 'bom'],
  ['NotObjectError', 31, 'not_object'],
  ['PolicyError', 40, 'policy'],
  ['NotFoundError', 41, 'notfound'],
  ['StoreError', 42, 'store'],
  ['BusyError', 43, 'busy'],
  ['CorruptError', 44, 'corrupt'],
  ['StaleError', 45, 'stale'],
];

/** The JSON errors (20-31) derive from JSONError, BusyError and
 * CorruptError from StoreError, as in the Python binding. */
export class JSONError extends IdemError {
  static code = 20;
  static status = 'syntax';
}

const byCode = new Map();
const classes = {};
for (const [name, code, status] of table) {
  const base = code >= 20 && code <= 31 ? JSONError
    : code === 43 || code === 44 ? classes.StoreError : IdemError;
  const cls = { [name]: class extends base {} }[name];
  cls.code = code;
  cls.status = status;
  Object.defineProperty(cls, 'name', { value: name });
  classes[name] = cls;
  byCode.set(code, cls);
}

export const {
  NoMemoryError, MisuseError, InvalidError, IOError, JSONSyntaxError,
  TrailingBytesError, UTF8Error, SurrogateError, DuplicateMemberError,
  NumberOverflowError, NumberUnderflowError, BigIntError, DepthError,
  TooBigError, BOMError, NotObjectError, PolicyError, NotFoundError,
  StoreError, BusyError, CorruptError, StaleError,
} = classes;
/** IDEM_RANGE (named so as not to shadow JS's own RangeError). */
export const IdemRangeError = classes.IdemRangeError;

/** Every class by its C code (IdemError for IDEM_ERROR). */
export const ERRORS = new Map([[1, IdemError], ...byCode]);

/** The error for C status `code`; IdemError for codes this version does
 * not know. */
export function errorFor(code, message) {
  const cls = byCode.get(code) ?? IdemError;
  return new cls(message, code);
}

// What a tool throws to say what happened downstream: the JS face of
// IDEM_OUTCOME_REJECTED and IDEM_OUTCOME_NOT_APPLIED.  Any other exception
// from a tool means the outcome is unknown.
export class ToolOutcome extends Error {
  static outcome = 0;
}
/** A definite failure: nothing was applied, and retrying will not help. */
export class Rejected extends ToolOutcome {
  static outcome = 2;
}
/** Certainly not applied (refused before sending, a retryable error). */
export class NotApplied extends ToolOutcome {
  static outcome = 3;
}
