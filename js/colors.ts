/**
 * Colors of the map's cell states (panel.css repeats them for the legend-like parts).
 * Color-blind friendly: the states differ in hue *and* lightness (teal, amber, magenta;
 * after Okabe-Ito and ColorBrewer PiYG), so they stay apart under deuteranopia and in grey
 * scale (both checked in js/__tests__/colors.test.ts).
 */
import { CellState, LITTLE_ENDIAN_HOST } from "./model";

export type Rgb = readonly [number, number, number];

export interface Palette {
  /** Indexed by CellState: no data, healthy, warning, error. */
  states: readonly [string, string, string, string];
  /** Markers and the hover frame: contrasts with every state color. */
  ink: string;
  /** The frame around the selected cell (the accent the feed's selection uses). */
  select: string;
}

// Healthy is the calm majority, so it is pale (light theme) or dim (dark theme); warnings
// and errors stand out from it.
export const LIGHT: Palette = {
  states: ["#ebebeb", "#8fcabc", "#e69f00", "#b3176f"],
  ink: "#1a1a1a",
  select: "#1976d2",
};

export const DARK: Palette = {
  states: ["#3a3a3a", "#3b7a6e", "#e6a100", "#f06bb4"],
  ink: "#f2f2f2",
  select: "#64b5f6",
};

export const STATE_NAMES = ["no data", "healthy", "warning", "error"] as const;

export function stateName(state: number): string {
  return STATE_NAMES[state] ?? "unknown";
}

export function parseHex(hex: string): Rgb {
  const h = hex.replace(/^#/, "");
  const full = h.length === 3 ? h.replace(/./g, (c) => c + c) : h;
  const n = Number.parseInt(full, 16);
  if (full.length !== 6 || Number.isNaN(n)) throw new Error(`not a hex color: ${hex}`);
  return [(n >> 16) & 255, (n >> 8) & 255, n & 255];
}

/** One RGBA pixel as the uint32 that ImageData's Uint32Array view holds on this host. */
export function packRgba([r, g, b]: Rgb, a = 255, littleEndian = LITTLE_ENDIAN_HOST): number {
  return littleEndian
    ? ((a << 24) | (b << 16) | (g << 8) | r) >>> 0
    : ((r << 24) | (g << 16) | (b << 8) | a) >>> 0;
}

/**
 * Lookup table state -> packed pixel, 256 entries so any byte indexes it: unknown states
 * draw as "no data".
 */
export function stateLut(palette: Palette, littleEndian = LITTLE_ENDIAN_HOST): Uint32Array {
  const lut = new Uint32Array(256).fill(packRgba(parseHex(palette.states[CellState.NoData]), 255, littleEndian));
  palette.states.forEach((hex, state) => {
    lut[state] = packRgba(parseHex(hex), 255, littleEndian);
  });
  return lut;
}

/** Dark theme? JupyterLab marks the body; VS Code adds a class; else the OS preference. */
export function isDarkTheme(doc: Document = document): boolean {
  const body = doc.body;
  if (body?.dataset.jpThemeLight === "false") return true;
  if (body?.dataset.jpThemeLight === "true") return false;
  if (body?.classList.contains("vscode-dark") || body?.classList.contains("vscode-high-contrast")) {
    return true;
  }
  if (body?.classList.contains("vscode-light")) return false;
  return doc.defaultView?.matchMedia?.("(prefers-color-scheme: dark)").matches ?? false;
}

export function paletteFor(dark: boolean): Palette {
  return dark ? DARK : LIGHT;
}
