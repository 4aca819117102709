/** Number formatting shared by the tooltip, the sliders and the header. */

/** Short form: "0.123", "12.3", "3.2e-5", "1e+3"; "\u2014" for NaN or infinities. */
export function formatNumber(x: number): string {
  if (!Number.isFinite(x)) return Number.isNaN(x) ? "\u2014" : x > 0 ? "inf" : "-inf";
  if (x === 0) return "0";
  const a = Math.abs(x);
  if (a >= 1e-2 && a < 1e4) return String(Number(x.toPrecision(3)));
  const [mant = "0", exp = "0"] = x.toExponential(1).split("e");
  const m = mant.replace(/\.0$/, "");
  return `${m}e${exp.replace(/^\+/, "")}`;
}

/** A log10 value shown as the number it stands for ("3.2e-5"); "\u2014" when missing. */
export function formatLog10(v: number): string {
  return Number.isFinite(v) ? formatNumber(10 ** v) : "\u2014";
}

/** "\u2026" + the tail of `text` that fits in `max` characters; layer names keep their leaf. */
export function truncateLeft(text: string, max: number): string {
  if (max <= 0) return "";
  if (text.length <= max) return text;
  return max === 1 ? "\u2026" : `\u2026${text.slice(text.length - (max - 1))}`;
}
