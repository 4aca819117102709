/**
 * Threshold sliders. Each maps a 0..STEPS range input onto its threshold, in log space for
 * the ratio-like thresholds. Which sliders there are, and each one's span, scale and help,
 * come from Python (the `sliders` trait, made from neuraldbg_nb.Thresholds). The value next
 * to a slider follows the thumb ("input"); the new thresholds go to Python when the thumb
 * is released ("change"), and the panel shows "reclassifying..." until Python answers with
 * new events or a new map.
 */
import { formatNumber } from "./format";
import type { SliderSpec, Thresholds } from "./model";

export type { SliderSpec } from "./model";

export const STEPS = 1000;
/** Slider positions one arrow key moves (PageUp / PageDown: five times as many). */
export const KEY_STEP = STEPS / 50;

/** Two significant digits: slider values read as "3.2e-5", not "3.1622776e-5". */
export function roundNice(x: number): number {
  return x === 0 || !Number.isFinite(x) ? x : Number(x.toPrecision(2));
}

/** Slider position (0..STEPS) -> threshold value. */
export function fromSlider(spec: SliderSpec, position: number): number {
  const t = Math.min(1, Math.max(0, position / STEPS));
  if (spec.log) {
    const lo = Math.log10(spec.min);
    const hi = Math.log10(spec.max);
    return roundNice(10 ** (lo + t * (hi - lo)));
  }
  return roundNice(spec.min + t * (spec.max - spec.min));
}

/** Threshold value -> slider position (0..STEPS), clamped to the slider's range. */
export function toSlider(spec: SliderSpec, value: number): number {
  if (!Number.isFinite(value)) return value > 0 ? STEPS : 0;
  let t: number;
  if (spec.log) {
    const lo = Math.log10(spec.min);
    const hi = Math.log10(spec.max);
    t = value > 0 ? (Math.log10(value) - lo) / (hi - lo) : 0;
  } else {
    t = (value - spec.min) / (spec.max - spec.min);
  }
  return Math.round(Math.min(1, Math.max(0, t)) * STEPS);
}

export function formatThreshold(spec: SliderSpec, value: number): string {
  return spec.key === "jump" ? `${formatNumber(value)}\u00d7` : formatNumber(value);
}

export interface SlidersView {
  readonly el: HTMLElement;
  /**
   * Show thresholds from Python (a slider being dragged keeps its thumb); `specs`, where
   * given and different from the sliders shown, builds them again.
   */
  update(thresholds: Thresholds, specs?: readonly SliderSpec[]): void;
  setBusy(busy: boolean): void;
}

export interface SlidersOptions {
  /** Called on release with the full new thresholds. */
  onChange(thresholds: Thresholds): void;
}

export function createSliders(
  parent: HTMLElement,
  specs: readonly SliderSpec[],
  initial: Thresholds,
  options: SlidersOptions,
): SlidersView {
  const root = document.createElement("div");
  root.className = "ndbg-sliders";
  const head = document.createElement("div");
  head.className = "ndbg-sliders-head";
  const title = document.createElement("span");
  title.className = "ndbg-sliders-title";
  title.textContent = "thresholds";
  const busy = document.createElement("span");
  busy.className = "ndbg-reclassifying";
  busy.textContent = "reclassifying\u2026";
  busy.hidden = true;
  head.append(title, busy);
  root.appendChild(head);
  const rows = document.createElement("div");
  rows.className = "ndbg-slider-rows";
  root.appendChild(rows);

  let current: Thresholds = { ...initial };
  let dragging: string | null = null;
  let shownSpecs = "";
  const inputs = new Map<string, { input: HTMLInputElement; value: HTMLElement; spec: SliderSpec }>();

  function row(spec: SliderSpec): HTMLElement {
    const line = document.createElement("label");
    line.className = "ndbg-slider-row";
    line.title = spec.help;
    const name = document.createElement("span");
    name.className = "ndbg-slider-label";
    name.textContent = spec.label;
    const input = document.createElement("input");
    input.type = "range";
    input.className = `ndbg-slider ndbg-slider-${spec.key}`;
    input.min = "0";
    input.max = String(STEPS);
    input.step = "1";
    input.dataset.key = spec.key;
    input.setAttribute("aria-label", spec.help);
    const value = document.createElement("span");
    value.className = `ndbg-slider-value ndbg-slider-value-${spec.key}`;
    line.append(name, input, value);
    inputs.set(spec.key, { input, value, spec });

    input.addEventListener("input", () => {
      dragging = spec.key;
      value.textContent = formatThreshold(spec, fromSlider(spec, Number(input.value)));
    });
    // Arrow keys move a slider by a visible amount (a 1/STEPS step reads as no move);
    // the native key handling fires "input" and "change" as a drag would.
    input.addEventListener("keydown", (e) => {
      const delta = { ArrowRight: 1, ArrowUp: 1, ArrowLeft: -1, ArrowDown: -1, PageUp: 5, PageDown: -5 }[e.key];
      if (delta === undefined) return;
      e.preventDefault();
      e.stopPropagation(); // the notebook's own shortcuts must not take the key
      const next = Math.min(STEPS, Math.max(0, Number(input.value) + delta * KEY_STEP));
      if (String(next) === input.value) return;
      input.value = String(next);
      input.dispatchEvent(new Event("input", { bubbles: true }));
      input.dispatchEvent(new Event("change", { bubbles: true }));
    });
    input.addEventListener("change", () => {
      dragging = null;
      const next = fromSlider(spec, Number(input.value));
      value.textContent = formatThreshold(spec, next);
      if (next === current[spec.key]) return;
      current = { ...current, [spec.key]: next };
      options.onChange(current);
    });
    return line;
  }

  function build(next: readonly SliderSpec[]): void {
    shownSpecs = JSON.stringify(next);
    inputs.clear();
    dragging = null;
    rows.replaceChildren(...next.map(row));
    root.hidden = next.length === 0;
  }

  function show(thresholds: Thresholds): void {
    current = { ...thresholds };
    for (const [key, { input, value, spec }] of inputs) {
      if (key === dragging) continue;
      const v = thresholds[key] ?? spec.default;
      input.value = String(toSlider(spec, v));
      value.textContent = formatThreshold(spec, v);
    }
  }

  build(specs);
  parent.appendChild(root);
  show(initial);

  return {
    el: root,
    update(thresholds, next) {
      if (next !== undefined && JSON.stringify(next) !== shownSpecs) build(next);
      show(thresholds);
    },
    setBusy(on) {
      busy.hidden = !on;
      root.classList.toggle("ndbg-busy", on);
    },
  };
}
