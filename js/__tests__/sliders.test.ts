import { describe, expect, it, vi } from "vitest";
import type { Thresholds } from "../model";
import { SLIDERS, STEPS, createSliders, fromSlider, roundNice, toSlider } from "../sliders";

const spec = (key: keyof Thresholds) => SLIDERS.find((s) => s.key === key)!;
const T: Thresholds = { vanish: 1e-6, explode: 1e3, jump: 10, dead: 0.5, saturated: 0.5 };

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
    for (const s of SLIDERS) {
      expect(fromSlider(s, toSlider(s, T[s.key]))).toBeCloseTo(T[s.key], 12);
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
    createSliders(host, { ...T, extra: 7 } as Thresholds, { onChange });
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
    const view = createSliders(host, T, { onChange: () => {} });
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
    const view = createSliders(host, T, { onChange: () => {} });
    const busy = host.querySelector<HTMLElement>(".ndbg-reclassifying")!;
    expect(busy.hidden).toBe(true);
    view.setBusy(true);
    expect(busy.hidden).toBe(false);
    expect(busy.textContent).toMatch(/reclassifying/);
  });
});
