import { describe, expect, it } from "vitest";
import palettes from "../../neuraldbg_nb/report/palette.json";
import { DARK, LIGHT, paletteCss } from "../colors";
import panelCss from "../panel.css";

describe("the palette has one home", () => {
  it("the canvas colors are palette.json's", () => {
    expect(LIGHT.states).toEqual(palettes.light.states);
    expect(DARK.states).toEqual(palettes.dark.states);
  });

  it("the panel's CSS variables are made from it, light and dark", () => {
    const css = paletteCss();
    const [light, dark] = css.split("\n");
    for (const [name, i] of [["healthy", 1], ["warning", 2], ["error", 3]] as const) {
      expect(light).toContain(`--ndbg-${name}: ${LIGHT.states[i]};`);
      expect(dark).toContain(`--ndbg-${name}: ${DARK.states[i]};`);
    }
    expect(dark).toContain('body[data-jp-theme-light="false"]');
  });

  it("panel.css repeats no state or severity color", () => {
    const css = panelCss.toLowerCase();
    for (const hex of [...palettes.light.states, ...palettes.dark.states, palettes.light.info, palettes.dark.info]) {
      expect(css).not.toContain(hex.toLowerCase());
    }
    expect(css).not.toMatch(/--ndbg-(healthy|warning|error|info):/);
  });
});
