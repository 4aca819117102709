import { afterEach, describe, expect, it } from "vitest";
import { DARK, LIGHT, isDarkTheme, packRgba, paletteFor, parseHex, stateLut, stateName, type Rgb } from "../colors";

/** WCAG relative luminance. */
function luminance([r, g, b]: Rgb): number {
  const lin = (c: number): number => {
    const s = c / 255;
    return s <= 0.03928 ? s / 12.92 : ((s + 0.055) / 1.055) ** 2.4;
  };
  return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b);
}

/** Deuteranopia simulation (Viénot, Brettel, Mollon 1999), in linear RGB. */
function deuteranopia([r, g, b]: Rgb): Rgb {
  const lin = (c: number): number => (c / 255) ** 2.2;
  const [R, G, B] = [lin(r), lin(g), lin(b)];
  const out = [0.29275 * R + 0.70725 * G, 0.29275 * R + 0.70725 * G, -0.02234 * R + 0.02234 * G + B];
  return out.map((c) => Math.round(255 * Math.max(0, Math.min(1, c)) ** (1 / 2.2))) as unknown as Rgb;
}

function distance(a: Rgb, b: Rgb): number {
  return Math.hypot(a[0] - b[0], a[1] - b[1], a[2] - b[2]);
}

describe("parseHex / packRgba", () => {
  it("parses 6 and 3 digit colors", () => {
    expect(parseHex("#c51b7d")).toEqual([197, 27, 125]);
    expect(parseHex("fff")).toEqual([255, 255, 255]);
    expect(() => parseHex("#12")).toThrow(/hex/);
  });

  it("packs pixels in the byte order ImageData uses", () => {
    const le = packRgba([1, 2, 3], 255, true);
    const bytes = new Uint8Array(new Uint32Array([le]).buffer);
    // This host is little-endian (x86, ARM): bytes must read R, G, B, A.
    expect(Array.from(bytes)).toEqual([1, 2, 3, 255]);
    expect(packRgba([1, 2, 3], 255, false)).toBe(0x010203ff);
  });
});

describe("stateLut", () => {
  it("maps the four states and draws unknown bytes as no data", () => {
    const lut = stateLut(LIGHT, true);
    expect(lut).toHaveLength(256);
    expect(lut[3]).toBe(packRgba(parseHex(LIGHT.states[3]), 255, true));
    expect(lut[200]).toBe(lut[0]);
    expect(new Set([lut[0], lut[1], lut[2], lut[3]]).size).toBe(4);
  });
});

describe("palettes", () => {
  for (const [name, palette] of [["light", LIGHT], ["dark", DARK]] as const) {
    it(`${name}: states stay apart for deuteranopes and in grey scale`, () => {
      const rgb = palette.states.map(parseHex);
      const sim = rgb.map(deuteranopia);
      const lum = rgb.map(luminance);
      for (let i = 0; i < 4; i++) {
        for (let j = i + 1; j < 4; j++) {
          expect(distance(sim[i]!, sim[j]!), `${stateName(i)} vs ${stateName(j)}`).toBeGreaterThan(60);
          expect(Math.abs(lum[i]! - lum[j]!), `${stateName(i)} vs ${stateName(j)}`).toBeGreaterThan(0.05);
        }
      }
    });
  }

  it("names states", () => {
    expect([0, 1, 2, 3, 9].map(stateName)).toEqual(["no data", "healthy", "warning", "error", "unknown"]);
  });
});

describe("isDarkTheme", () => {
  afterEach(() => {
    delete document.body.dataset.jpThemeLight;
    document.body.className = "";
  });

  it("follows JupyterLab's body attribute", () => {
    document.body.dataset.jpThemeLight = "false";
    expect(isDarkTheme()).toBe(true);
    expect(paletteFor(isDarkTheme())).toBe(DARK);
    document.body.dataset.jpThemeLight = "true";
    expect(isDarkTheme()).toBe(false);
  });

  it("follows VS Code's body class", () => {
    document.body.className = "vscode-dark";
    expect(isDarkTheme()).toBe(true);
  });
});
