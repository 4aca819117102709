import { describe, expect, it, vi } from "vitest";
import { buildFeed, createFeed } from "../feed";
import { stepLabel, STATUS_LABELS, watchedNothing } from "../header";
import type { PanelEvent, Snapshot } from "../model";
import { KEY_STEP, createSliders } from "../sliders";
import { DEFAULTS, SLIDER_SPECS } from "./slider-specs";

function ev(id: number, step: number, cause: number | null): PanelEvent {
  return { id, step, layer: `l${id}`, kind: "exploding_gradient", severity: "error", message: `event ${id}`, symptom_of: cause };
}

function snap(over: Partial<Snapshot>): Snapshot {
  return {
    layers: ["a", "b"], status: "finished", step: 10, loss: new Float32Array(), map: new Uint8Array(), mapCols: 0,
    mapSteps: [0, 10], mapValues: new Float32Array(), mapAct: new Float32Array(), markers: [], firstFailure: null,
    likelyCauses: [], events: [], thresholds: { ...DEFAULTS }, sliders: [...SLIDER_SPECS], selected: null,
    inspectorHtml: "", message: "", cost: "", costDetail: "", notes: [], baseline: null, ...over,
  };
}

describe("what the header says", () => {
  it("numbers the last step as the map's axis does", () => {
    expect(stepLabel(300)).toBe("step 299");
    expect(stepLabel(0)).toBe("no step yet");
  });
  it("names every status the run can end in", () => {
    expect(STATUS_LABELS.interrupted).toBe("interrupted");
    expect(STATUS_LABELS.exited).toBe("exited");
  });
  it("tells a run that watched nothing from a healthy one", () => {
    expect(watchedNothing({ status: "finished", step: 0, layers: ["a"] })).toBe(true);
    expect(watchedNothing({ status: "finished", step: 5, layers: [] })).toBe(true);
    expect(watchedNothing({ status: "training", step: 0, layers: [] })).toBe(false);
    expect(watchedNothing({ status: "finished", step: 5, layers: ["a"] })).toBe(false);
  });
});

describe("the feed", () => {
  const events = [ev(0, 5, null), ...Array.from({ length: 30 }, (_, i) => ev(i + 1, 6 + i, 0))];

  it("expands a cause's symptoms on request", () => {
    expect(buildFeed(events, 200, 20).groups[0]!.moreSymptoms).toBe(10);
    const all = buildFeed(events, 200, 20, new Set([0])).groups[0]!;
    expect(all.symptoms.length).toBe(30);
    expect(all.moreSymptoms).toBe(0);
  });

  it("opens the hidden symptoms when '+N more symptoms' is clicked", () => {
    const parent = document.createElement("div");
    document.body.appendChild(parent);
    const feed = createFeed(parent, { onSelect: vi.fn() });
    feed.update(snap({ events, firstFailure: events[0]! }), null);
    const more = parent.querySelector<HTMLButtonElement>(".ndbg-symptoms-more")!;
    expect(more.textContent).toContain("+10 more symptoms");
    more.click();
    expect(parent.querySelectorAll(".ndbg-symptom").length).toBe(30);
    expect(parent.querySelector(".ndbg-symptoms-more")).toBeNull();
    parent.remove();
  });

  it("says nothing was watched rather than that every layer stayed healthy", () => {
    const parent = document.createElement("div");
    const feed = createFeed(parent, { onSelect: vi.fn() });
    feed.update(snap({ step: 0 }), null);
    expect(parent.textContent).toContain("nothing was watched");
    expect(parent.textContent).not.toContain("stayed healthy");
    feed.update(snap({}), null);
    expect(parent.textContent).toContain("every layer stayed healthy");
  });
});

describe("the sliders and the keyboard", () => {
  it("moves a slider by a visible step on an arrow key and re-classifies", () => {
    const parent = document.createElement("div");
    const onChange = vi.fn();
    createSliders(parent, SLIDER_SPECS, DEFAULTS, { onChange });
    const input = parent.querySelector<HTMLInputElement>(".ndbg-slider-jump")!;
    const before = Number(input.value);
    input.dispatchEvent(new KeyboardEvent("keydown", { key: "ArrowRight", bubbles: true }));
    expect(Number(input.value)).toBe(before + KEY_STEP);
    expect(onChange).toHaveBeenCalledTimes(1);
    expect(onChange.mock.calls[0]![0].jump).toBeGreaterThan(DEFAULTS.jump!);
  });

  it("has a slider for max_update", () => {
    expect(SLIDER_SPECS.map((s) => s.key)).toContain("max_update");
  });
});

describe("a deep model's map", () => {
  it("scrolls to the first failure's row when training ends", async () => {
    const { default: widget } = await import("../index");
    const { FakeModel, f32, u8 } = await import("./fake-model");
    const { ROW_HEIGHT, MAX_VIEW_HEIGHT } = await import("../heatmap");
    const layers = Array.from({ length: 200 }, (_, i) => `block.${i}`);
    const first = { id: 0, step: 5, layer: "block.150", kind: "regime_shift", severity: "error" as const, message: "jump" };
    const model = new FakeModel({
      layers, status: "training", step: 10, loss: f32([1]), map: u8(new Array(2000).fill(1)), map_cols: 10,
      map_steps: [0, 10], map_values: f32([]), map_act: f32([]), markers: [], first_failure: null, likely_causes: [],
      events: [], thresholds: { ...DEFAULTS }, sliders: [...SLIDER_SPECS], selected: null, inspector_html: "",
      message: "", cost: "", cost_detail: "", notes: [],
    });
    const el = document.createElement("div");
    document.body.appendChild(el);
    const cleanup = widget.render({ model: model.asModel(), el });
    const scroll = el.querySelector<HTMLElement>(".ndbg-map-scroll")!;
    expect(scroll.scrollTop).toBe(0);
    model.update("events", [{ ...first, symptom_of: null }]);
    model.update("first_failure", first);
    model.update("status", "finished");
    await new Promise((r) => setTimeout(r, 50));
    const top = 150 * ROW_HEIGHT;
    expect(scroll.scrollTop).toBeGreaterThan(top - MAX_VIEW_HEIGHT);
    expect(scroll.scrollTop).toBeLessThanOrEqual(top);
    cleanup();
    el.remove();
  });
});

describe("a value flickering around its line", () => {
  const warn = (id: number, step: number, layer = "27"): PanelEvent => ({
    id, step, layer, kind: "dead_units", severity: "warning", message: `dead ${id}`, symptom_of: null,
  });
  const back = (id: number, step: number, layer = "27"): PanelEvent => ({
    id, step, layer, kind: "recovery", severity: "info", message: `back ${id}`, symptom_of: null,
  });

  it("is one feed row, not one per crossing", () => {
    const events = [warn(0, 0), back(1, 6), warn(2, 34), back(3, 64), warn(4, 67), back(5, 77), warn(6, 90, "29")];
    const layout = buildFeed(events);
    expect(layout.groups.map((g) => g.cause.id)).toEqual([0, 6]);
    expect(layout.groups[0]!.repeats).toBe(5);
    expect(layout.groups[0]!.lastStep).toBe(77);
    expect(layout.hidden).toBe(0);
  });

  it("leaves a warning and its one recovery as they are", () => {
    const events = [warn(0, 0), back(1, 6), warn(2, 34), back(3, 64)];
    expect(buildFeed(events).groups.map((g) => g.cause.id)).toEqual([0, 1, 2, 3]);
  });

  it("says so in the row", () => {
    const parent = document.createElement("div");
    const feed = createFeed(parent, { onSelect: vi.fn() });
    feed.update(snap({ events: [warn(0, 0), back(1, 6), warn(2, 34), back(3, 64), warn(4, 67)] }), null);
    expect(parent.querySelectorAll(".ndbg-event").length).toBe(1);
    expect(parent.querySelector(".ndbg-event-repeats")!.textContent).toBe("on and off 5\u00d7 until step 67");
  });
});
