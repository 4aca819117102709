import { describe, expect, it, vi } from "vitest";
import { defaults, type SliderSpec, type Thresholds } from "../model";
import { STEPS, createSliders, fromSlider, roundNice, toSlider } from "../sliders";
import { DEFAULTS, SLIDER_SPECS } from "./slider-specs";

const spec = (key: string): SliderSpec => SLIDER_SPECS.find((s) => s.key === key)!;
const T: Thresholds = { ...DEFAULTS };

describe("slider scales", () => {
  it("span the documented ranges", () => {
    expect(fromSlider(spec("vanish"), 0)).toBe(1e-10);
    expect(fromSlider(spec("vanish"), STEPS)).toBe(1e-2);
    expect(fromSlider(spec("explode"), 0)).toBe(1);
    expect(fromSlider(spec("explode"), STEPS)).toBe(1e8);
    expect(fromSlider(spec("jump"), 0)).toBe(2);
    expect(fromSlider(spec("jump"), STEPS)).toBe(1000);
    expect(fromSlider(spec("dead"), 0)).toBe(0.1);
    expect(fromSlider(spec("saturated"), STEPS)).toBe(1);
  });

  it("are logarithmic where they should be", () => {
    expect(fromSlider(spec("vanish"), STEPS / 2)).toBe(1e-6);
    expect(fromSlider(spec("explode"), STEPS / 2)).toBe(1e4);
    expect(fromSlider(spec("dead"), STEPS / 2)).toBe(0.55);
  });

  it("round-trip the defaults and clamp out-of-range values", () => {
    for (const s of SLIDER_SPECS) {
      expect(fromSlider(s, toSlider(s, s.default))).toBeCloseTo(s.default, 12);
    }
    expect(toSlider(spec("explode"), 1e12)).toBe(STEPS);
    expect(toSlider(spec("vanish"), 0)).toBe(0);
    expect(toSlider(spec("dead"), Number.NaN)).toBe(0);
  });

  it("round to two significant digits", () => {
    expect(roundNice(3.16227766e-5)).toBe(3.2e-5);
    expect(roundNice(0)).toBe(0);
  });
});

describe("createSliders", () => {
  it("shows each value, follows the thumb and sends on release only", () => {
    const host = document.createElement("div");
    const onChange = vi.fn();
    createSliders(host, SLIDER_SPECS, { ...T, extra: 7 }, { onChange });
    const input = host.querySelector<HTMLInputElement>(".ndbg-slider-vanish")!;
    const value = host.querySelector(".ndbg-slider-value-vanish")!;
    expect(value.textContent).toBe("1e-6");
    expect(input.value).toBe("500");

    input.value = "750";
    input.dispatchEvent(new Event("input"));
    expect(value.textContent).toBe("1e-4");
    expect(onChange).not.toHaveBeenCalled();

    input.dispatchEvent(new Event("change"));
    expect(onChange).toHaveBeenCalledTimes(1);
    // The other thresholds (and keys the panel does not know) go back unchanged.
    expect(onChange.mock.calls[0]![0]).toEqual({ ...T, extra: 7, vanish: 1e-4 });
  });

  it("follows thresholds from Python but not under a dragged thumb", () => {
    const host = document.createElement("div");
    const view = createSliders(host, SLIDER_SPECS, T, { onChange: () => {} });
    const jump = host.querySelector<HTMLInputElement>(".ndbg-slider-jump")!;
    const dead = host.querySelector<HTMLInputElement>(".ndbg-slider-dead")!;
    jump.value = "10";
    jump.dispatchEvent(new Event("input"));
    view.update({ ...T, jump: 100, dead: 1 });
    expect(jump.value).toBe("10");
    expect(dead.value).toBe(String(STEPS));
    expect(host.querySelector(".ndbg-slider-value-dead")!.textContent).toBe("1");
  });

  it("shows the busy state", () => {
    const host = document.createElement("div");
    const view = createSliders(host, SLIDER_SPECS, T, { onChange: () => {} });
    const busy = host.querySelector<HTMLElement>(".ndbg-reclassifying")!;
    expect(busy.hidden).toBe(true);
    view.setBusy(true);
    expect(busy.hidden).toBe(false);
    expect(busy.textContent).toMatch(/reclassifying/);
  });

  it("are the sliders Python describes, with its help and defaults", () => {
    const host = document.createElement("div");
    createSliders(host, SLIDER_SPECS, {}, { onChange: () => {} });
    const inputs = [...host.querySelectorAll<HTMLInputElement>(".ndbg-slider")];
    expect(inputs.map((i) => i.dataset.key)).toEqual(SLIDER_SPECS.map((s) => s.key));
    const row = host.querySelector<HTMLElement>(".ndbg-slider-row")!;
    expect(row.title).toBe(SLIDER_SPECS[0]!.help);
    // no thresholds from Python yet: each slider shows its setting's default
    expect(host.querySelector(".ndbg-slider-value-vanish")!.textContent).toBe("1e-6");
    expect(defaults(SLIDER_SPECS)).toEqual(DEFAULTS);
  });

  it("are built again when Python sends other sliders", () => {
    const host = document.createElement("div");
    const view = createSliders(host, SLIDER_SPECS, T, { onChange: () => {} });
    const only: SliderSpec[] = [{ ...spec("jump"), label: "jump" }];
    view.update({ jump: 20 }, only);
    const inputs = [...host.querySelectorAll<HTMLInputElement>(".ndbg-slider")];
    expect(inputs.map((i) => i.dataset.key)).toEqual(["jump"]);
    expect(host.querySelector(".ndbg-slider-value-jump")!.textContent).toBe("20\u00d7");
    view.update({ jump: 20 }, []);
    expect(view.el.hidden).toBe(true);
  });
});
