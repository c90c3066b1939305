// Parameters as the page shows them. Values stay exact in the API, the JSON and the CSV; the
// page shows each number as the shortest decimal that still tells it apart from the other
// values of its column (at least 4 significant digits, never more than the value has), with the
// exact value on hover. Grid values like 0.001 show as written; a random draw like
// 0.00026057902620338835 shows as 0.0002606.

/** Flattens nested parameter objects to dotted keys: `{model: {lr: 1}}` → `{'model.lr': 1}`. */
export function flatParams(params, prefix = '', out = {}) {
  if (params === null || typeof params !== 'object' || Array.isArray(params)) {
    if (prefix) out[prefix] = params;
    return out;
  }
  for (const [key, value] of Object.entries(params)) {
    const path = prefix ? `${prefix}.${key}` : key;
    if (value !== null && typeof value === 'object' && !Array.isArray(value)) flatParams(value, path, out);
    else out[path] = value;
  }
  return out;
}

/** A parameter value exactly as stored: strings bare, everything else as JSON. */
export function exactText(value) {
  if (typeof value === 'string') return value;
  if (value === undefined) return '';
  return JSON.stringify(value);
}

const MIN_DIGITS = 4;

/** Significant digits of the shortest round-trip form of `value` (`0.00125` → 3). */
function digitsOf(value) {
  const mantissa = Math.abs(value).toExponential().split('e')[0].replace('.', '');
  return mantissa.length;
}

/** `value` to `digits` significant digits, as the shortest text of that rounded number. */
function rounded(value, digits) {
  return String(Number(value.toPrecision(Math.min(Math.max(digits, 1), 17))));
}

/**
 * A formatter for the values of one column (or one list): the fewest significant digits (at
 * least 4) that keep its distinct numbers distinct. Answers `value → {text, exact}`; `exact`
 * is set when `text` is shortened.
 */
export function paramFormatter(values) {
  const numbers = [...new Set(values.filter((value) => typeof value === 'number' && Number.isFinite(value)))];
  let digits = MIN_DIGITS;
  while (digits < 17 && new Set(numbers.map((value) => rounded(value, digits))).size < numbers.length) digits += 1;
  return (value) => {
    if (typeof value === 'number' && Number.isFinite(value) && !Number.isInteger(value)) {
      // Never round into the integer part: 123456.789 shows as 123456.8, not 123500.
      const whole = Math.abs(value) >= 1 ? Math.floor(Math.log10(Math.abs(value))) + 2 : 0;
      const wanted = Math.max(digits, whole);
      if (digitsOf(value) > wanted) return { text: rounded(value, wanted), exact: String(value) };
    }
    if (Array.isArray(value) && value.some((item) => typeof item === 'number' && !Number.isInteger(item))) {
      const inner = paramFormatter(value);
      const parts = value.map((item) => (typeof item === 'number' ? inner(item).text : JSON.stringify(item)));
      const text = `[${parts.join(',')}]`;
      const exact = exactText(value);
      return { text, exact: text === exact ? null : exact };
    }
    return { text: exactText(value), exact: null };
  };
}

/** One value on its own (job page, dry run): 4 significant digits at least. */
export function paramText(value) {
  return paramFormatter([value])(value).text;
}

/** `lr=0.001  batch_size=2048`, numbers shortened; `exactLine` is the same with exact values. */
export function paramsLine(params) {
  return Object.entries(flatParams(params)).map(([key, value]) => `${key}=${paramText(value)}`).join('  ');
}

export function exactLine(params) {
  return Object.entries(flatParams(params)).map(([key, value]) => `${key}=${exactText(value)}`).join('  ');
}
