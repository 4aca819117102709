/**
 * Colors of the map's cell states and the severities, light and dark. Their one home is
 * neuraldbg_nb/report/palette.json: the canvas reads it here, the panel's CSS variables are
 * made from it (`paletteCss`), and the static copy of the diagnosis (report/static.py) reads
 * the same file, so a severity has one color wherever it is drawn.
 * Color-blind friendly: the states differ in hue *and* lightness (teal, amber, magenta;
 * after Okabe-Ito and ColorBrewer PiYG), so they stay apart under deuteranopia and in grey
 * scale (both checked in js/__tests__/colors.test.ts).
 */
import palettes from "../neuraldbg_nb/report/palette.json";
import { CellState, LITTLE_ENDIAN_HOST } from "./model";

export type Rgb = readonly [number, number, number];

export interface Palette {
  /** Indexed by CellState: no data, healthy, warning, error. */
  states: readonly [string, string, string, string];
  /** Events that are neither warnings nor errors. */
  info: string;
  /** Markers and the hover frame: contrasts with every state color. */
  ink: string;
  /** The frame around the selected cell (the accent the feed's selection uses). */
  select: string;
}

function palette(p: { states: string[]; info: string; ink: string; select: string }): Palette {
  const [nodata, healthy, warning, error] = p.states;
  if (error === undefined || nodata === undefined || healthy === undefined || warning === undefined) {
    throw new Error("palette.json: a theme needs four state colors");
  }
  return { states: [nodata, healthy, warning, error], info: p.info, ink: p.ink, select: p.select };
}

// Healthy is the calm majority, so it is pale (light theme) or dim (dark theme); warnings
// and errors stand out from it.
export const LIGHT: Palette = palette(palettes.light);
export const DARK: Palette = palette(palettes.dark);

function cssVars(p: Palette): string {
  return (
    `--ndbg-nodata: ${p.states[CellState.NoData]}; --ndbg-healthy: ${p.states[CellState.Healthy]}; ` +
    `--ndbg-warning: ${p.states[CellState.Warning]}; --ndbg-error: ${p.states[CellState.Error]}; ` +
    `--ndbg-info: ${p.info};`
  );
}

/**
 * The panel's state and severity CSS variables, light and dark, made from the palette; the
 * badges keep the light error color in both themes (white text on it). panel.css uses them.
 */
export function paletteCss(): string {
  return (
    `.ndbg-panel { ${cssVars(LIGHT)} --ndbg-error-badge: ${LIGHT.states[CellState.Error]}; }\n` +
    `body[data-jp-theme-light="false"] .ndbg-panel, body.vscode-dark .ndbg-panel { ${cssVars(DARK)} }\n`
  );
}

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
