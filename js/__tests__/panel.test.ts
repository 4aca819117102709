import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import * as panelModule from "../index";
import widget from "../index";
import { REQUEST_TIMEOUT_MS } from "../requests";
import { ROW_HEIGHT } from "../heatmap";
import type { PanelEvent, PanelTraits } from "../model";
import { SAVE_DEBOUNCE_MS } from "../sync";
import { FakeModel, f32, u8 } from "./fake-model";
import { DEFAULTS, SLIDER_SPECS } from "./slider-specs";

const LAYERS = ["embed", "encoder.layers.0.linear1", "encoder.layers.0.linear2", "head"];
const COLS = 10;

const EVENTS: PanelEvent[] = [
  { id: 1, step: 42, layer: "encoder.layers.0.linear1", kind: "regime_shift", severity: "error", message: "encoder.layers.0.linear1: activations jumped 240x at step 42", symptom_of: null },
  { id: 2, step: 44, layer: "head", kind: "exploding_gradient", severity: "error", message: "head: gradient norm 3e4 at step 44", symptom_of: 1 },
  { id: 3, step: 45, layer: "embed", kind: "exploding_gradient", severity: "error", message: "embed: gradient norm 5e3 at step 45", symptom_of: 1 },
  { id: 4, step: 70, layer: null, kind: "loss_divergence", severity: "warning", message: "loss rose 20x at step 70", symptom_of: null },
];

function traits(): PanelTraits {
  const map = new Array(LAYERS.length * COLS).fill(1);
  map[1 * COLS + 4] = 3; // encoder.layers.0.linear1, steps 40-49
  map[3 * COLS + 4] = 2;
  return {
    layers: LAYERS,
    status: "stopped",
    step: 100,
    loss: f32([2.3, 2.1, 1.9, Number.NaN, 1.7]),
    map: u8(map),
    map_cols: COLS,
    map_steps: [0, 100],
    map_values: f32(new Array(LAYERS.length * COLS).fill(-2)),
    map_act: f32(new Array(LAYERS.length * COLS).fill(Number.NaN)),
    markers: [{ row: 1, step: 42, kind: "regime_shift", severity: "error" }],
    first_failure: { id: 1, step: 42, layer: "encoder.layers.0.linear1", kind: "regime_shift", severity: "error", message: EVENTS[0]!.message },
    likely_causes: [],
    events: EVENTS,
    thresholds: { ...DEFAULTS },
    sliders: [...SLIDER_SPECS],
    selected: null,
    inspector_html: "",
    message: "click an event to inspect it",
    cost: "watching +1.0 ms/step (+3.1%)",
    cost_detail: "neuraldbg's own time: 1.02 ms a step, +3.1% on the loop's 33.0 ms (last 256 steps; layer hooks 0.30 ms, full statistics 0.10 ms).",
    notes: [],
    baseline: null,
  };
}

let model: FakeModel;
let el: HTMLElement;
let cleanup: () => void;

function $(selector: string): HTMLElement {
  const node = el.querySelector<HTMLElement>(selector);
  if (!node) throw new Error(`no ${selector}`);
  return node;
}

function mount(values: Partial<PanelTraits> = {}): void {
  model = new FakeModel({ ...traits(), ...values });
  el = document.createElement("div");
  document.body.appendChild(el);
  cleanup = widget.render({ model: model.asModel(), el });
}

beforeEach(() => {
  vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout", "requestAnimationFrame", "cancelAnimationFrame", "performance"] });
});

afterEach(() => {
  cleanup?.();
  el?.remove();
  vi.useRealTimers();
});

describe("the module", () => {
  it("exports render only through the default object (anywidget deprecates a named render)", () => {
    expect("render" in panelModule).toBe(false);
    expect(typeof panelModule.default.render).toBe("function");
  });
});

describe("render", () => {
  it("draws header, map, first failure, feed and sliders from the traits at once", () => {
    mount();
    expect($(".ndbg-panel").querySelector("style")!.textContent).toContain(".ndbg-panel");
    expect($(".ndbg-status").textContent).toBe("stopped at failure");
    expect($(".ndbg-status").classList.contains("ndbg-status-stopped")).toBe(true);
    expect($(".ndbg-step").textContent).toBe("step 99");
    expect($(".ndbg-loss-value").textContent).toBe("1.7");
    expect($(".ndbg-cost").textContent).toBe("watching +1.0 ms/step (+3.1%)");
    expect($(".ndbg-cost").title).toContain("1.02 ms a step");
    expect($(".ndbg-cost").hidden).toBe(false);
    expect(el.querySelectorAll(".ndbg-sparkline-nan")).toHaveLength(1);
    expect($(".ndbg-message").textContent).toBe("click an event to inspect it");
    expect(el.querySelectorAll(".ndbg-map-label")).toHaveLength(4);
    expect($(".ndbg-first-failure").hidden).toBe(false);
    expect($(".ndbg-first-failure").textContent).toContain("jumped 240x at step 42");
    expect($(".ndbg-panel").dataset.drawMs).toMatch(/^\d+\.\d\d$/);
    expect($(".ndbg-panel").dataset.status).toBe("stopped");
    expect($(".ndbg-inspector").hidden).toBe(true);
    for (const key of ["vanish", "explode", "jump", "dead", "saturated"]) {
      expect(el.querySelector(`.ndbg-slider-${key}`)).not.toBeNull();
    }
  });

  it("groups symptoms under their cause in the feed", () => {
    mount();
    const groups = el.querySelectorAll(".ndbg-group");
    expect(groups).toHaveLength(2);
    expect(groups[0]!.querySelectorAll(".ndbg-symptom")).toHaveLength(2);
    expect(groups[0]!.querySelector(".ndbg-cause")!.classList.contains("ndbg-is-first")).toBe(true);
    expect(el.querySelectorAll(".ndbg-event")).toHaveLength(4);
  });

  it("clicking a feed event sets `selected`, saves it and opens the inspector waiting", () => {
    mount();
    el.querySelector<HTMLElement>('.ndbg-event[data-id="2"] .ndbg-event-message')!.click();
    expect(model.values.selected).toEqual({ layer: "head", step: 44 });
    expect(model.saves).toBe(1); // at once: a click is not debounced
    vi.advanceTimersByTime(SAVE_DEBOUNCE_MS);
    expect(model.saves).toBe(1);
    expect(model.saved[0]).toEqual({ selected: { layer: "head", step: 44 } });
    expect($(".ndbg-inspector").hidden).toBe(false);
    expect($(".ndbg-inspector-status").textContent).toMatch(/waiting/);
    vi.advanceTimersByTime(20); // a frame
    expect($('.ndbg-event[data-id="2"]').classList.contains("ndbg-selected")).toBe(true);
  });

  describe("highlights exactly what was clicked", () => {
    // Shares layer and step with the first failure (id 1): `selected` cannot tell them apart.
    const TWIN: PanelEvent = {
      id: 5, step: 42, layer: "encoder.layers.0.linear1", kind: "exploding_update", severity: "error",
      message: "encoder.layers.0.linear1: weights moved 900x their size at step 42", symptom_of: 1,
    };
    const highlighted = (): string[] =>
      Array.from(el.querySelectorAll<HTMLElement>(".ndbg-selected")).map((n) =>
        n.classList.contains("ndbg-first-failure") ? "first" : `event ${n.dataset.id}`,
      );
    const frame = (): void => void vi.advanceTimersByTime(20);

    it("a feed row: that row only, not the first-failure box nor its twin", () => {
      mount({ events: [...EVENTS, TWIN] });
      $('.ndbg-event[data-id="1"]').click();
      frame();
      expect(model.values.selected).toEqual({ layer: "encoder.layers.0.linear1", step: 42 });
      expect(highlighted()).toEqual(["event 1"]);
      $('.ndbg-event[data-id="5"] .ndbg-event-kind').click();
      frame();
      expect(highlighted()).toEqual(["event 5"]);
    });

    it("the first-failure box: the box only; then its row, though `selected` does not change", () => {
      mount({ events: [...EVENTS, TWIN] });
      $(".ndbg-first-failure").click();
      frame();
      expect(highlighted()).toEqual(["first"]);
      $('.ndbg-event[data-id="1"]').click();
      frame();
      expect(model.values.selected).toEqual({ layer: "encoder.layers.0.linear1", step: 42 });
      expect(highlighted()).toEqual(["event 1"]);
      $(".ndbg-first-failure").dispatchEvent(new KeyboardEvent("keydown", { key: "Enter", bubbles: true }));
      frame();
      expect(highlighted()).toEqual(["first"]);
    });

    it("a map cell: the events of that layer in that bucket, nothing else", () => {
      mount({ events: [...EVENTS, TWIN] });
      // x = 250 is column 4 (steps 40-49) of the 600 px fallback width; row 1.
      $(".ndbg-map-canvas").dispatchEvent(new MouseEvent("click", { clientX: 250, clientY: ROW_HEIGHT + 2, bubbles: true }));
      frame();
      expect(highlighted()).toEqual(["event 1", "event 5"]);
      // A cell of the same layer without events highlights no row.
      $(".ndbg-map-canvas").dispatchEvent(new MouseEvent("click", { clientX: 5, clientY: ROW_HEIGHT + 2, bubbles: true }));
      frame();
      expect(highlighted()).toEqual([]);
    });

    it("follows the clicked event when re-classification renumbers the events", () => {
      mount({ events: [...EVENTS, TWIN] });
      $('.ndbg-event[data-id="5"]').click();
      frame();
      // Python's new feed: the twin is now id 2, and id 5 is another event.
      const renumbered: PanelEvent[] = [
        { ...EVENTS[0]!, id: 1 },
        { ...TWIN, id: 2 },
        { ...EVENTS[1]!, id: 5 },
      ];
      model.update("events", renumbered);
      frame();
      expect(highlighted()).toEqual(["event 2"]);
      // The clicked event gone: no row stands in for it.
      model.update("events", [EVENTS[0]!]);
      frame();
      expect(highlighted()).toEqual([]);
    });

    it("drops the highlight when the inspector closes or Python selects something else", () => {
      mount({ events: [...EVENTS, TWIN], inspector_html: "" });
      $('.ndbg-event[data-id="2"]').click();
      model.update("inspector_html", "<p>head</p>");
      frame();
      expect(highlighted()).toEqual(["event 2"]);
      $(".ndbg-inspector-close").click();
      frame();
      expect(highlighted()).toEqual([]);
      $('.ndbg-event[data-id="2"]').click();
      frame();
      expect(highlighted()).toEqual(["event 2"]);
      model.update("selected", { layer: "embed", step: 45 });
      frame();
      expect(highlighted()).toEqual([]);
    });
  });

  it("clicking the first failure selects its layer and step", () => {
    mount();
    $(".ndbg-first-failure").click();
    expect(model.values.selected).toEqual({ layer: "encoder.layers.0.linear1", step: 42 });
  });

  it("the keyboard selects a focused event", () => {
    mount();
    $('.ndbg-event[data-id="4"]').dispatchEvent(new KeyboardEvent("keydown", { key: "Enter", bubbles: true }));
    expect(model.values.selected).toEqual({ layer: null, step: 70 });
  });

  it("clicking a map cell selects the row's layer and the worst step of the bucket", () => {
    mount();
    const canvas = $(".ndbg-map-canvas");
    // 600 px fallback width, 10 columns: x = 250 is column 4 (steps 40-49); row 1.
    canvas.dispatchEvent(new MouseEvent("click", { clientX: 250, clientY: ROW_HEIGHT + 2, bubbles: true }));
    expect(model.values.selected).toEqual({ layer: "encoder.layers.0.linear1", step: 42 });
    // A bucket without events: its center step.
    canvas.dispatchEvent(new MouseEvent("click", { clientX: 5, clientY: 2, bubbles: true }));
    expect(model.values.selected).toEqual({ layer: "embed", step: 4 });
    vi.advanceTimersByTime(SAVE_DEBOUNCE_MS);
    expect(model.saves).toBe(2); // each click asks Python at once
    expect(model.saved[1]).toEqual({ selected: { layer: "embed", step: 4 } });
  });

  it("hovering a cell shows a tooltip with layer, steps, state and values", () => {
    mount();
    const canvas = $(".ndbg-map-canvas");
    canvas.dispatchEvent(new MouseEvent("mousemove", { clientX: 250, clientY: ROW_HEIGHT + 2, bubbles: true }));
    const tip = $(".ndbg-tooltip");
    expect(tip.hidden).toBe(false);
    expect(tip.textContent).toContain("encoder.layers.0.linear1");
    expect(tip.textContent).toContain("steps 40\u201349");
    expect(tip.textContent).toContain("state: error");
    expect(tip.textContent).toContain("grad norm: 0.01");
    expect(tip.textContent).toContain("act |max|: \u2014");
    expect(tip.textContent).toContain("regime_shift at step 42");
    canvas.dispatchEvent(new MouseEvent("mouseleave"));
    expect(tip.hidden).toBe(true);
  });

  it("a slider release sends thresholds and shows reclassifying until Python answers", () => {
    mount();
    const input = el.querySelector<HTMLInputElement>(".ndbg-slider-explode")!;
    input.value = "1000";
    input.dispatchEvent(new Event("input"));
    expect($(".ndbg-slider-value-explode").textContent).toBe("1e8");
    expect(model.values.thresholds!.explode).toBe(1e3);
    input.dispatchEvent(new Event("change"));
    expect(model.values.thresholds!.explode).toBe(1e8);
    expect($(".ndbg-reclassifying").hidden).toBe(false);
    expect($(".ndbg-panel").dataset.reclassifying).toBe("true");
    vi.advanceTimersByTime(SAVE_DEBOUNCE_MS);
    expect(model.saved).toEqual([{ thresholds: { ...traits().thresholds, explode: 1e8 } }]);
    // Python answers with new events.
    model.update("events", EVENTS.slice(0, 1));
    expect($(".ndbg-reclassifying").hidden).toBe(true);
    vi.advanceTimersByTime(20);
    expect(el.querySelectorAll(".ndbg-event")).toHaveLength(1);
  });

  it("gives up the reclassifying state when Python does not answer", () => {
    mount();
    const input = el.querySelector<HTMLInputElement>(".ndbg-slider-dead")!;
    input.value = "0";
    input.dispatchEvent(new Event("change"));
    expect($(".ndbg-reclassifying").hidden).toBe(false);
    vi.advanceTimersByTime(REQUEST_TIMEOUT_MS);
    expect($(".ndbg-reclassifying").hidden).toBe(true);
  });

  it("coalesces changes into one frame", () => {
    mount({ status: "training", step: 0 });
    for (let s = 1; s <= 20; s++) model.update("step", s);
    expect($(".ndbg-step").textContent).toBe("no step yet");
    vi.advanceTimersByTime(20);
    expect($(".ndbg-step").textContent).toBe("step 19");
    model.update("status", "finished");
    vi.advanceTimersByTime(20);
    expect($(".ndbg-status").textContent).toBe("finished");
  });

  it("redraws the map when the map changes, and records the draw time", () => {
    mount();
    const panel = $(".ndbg-panel");
    delete panel.dataset.drawMs;
    model.update("map", u8(new Array(LAYERS.length * COLS).fill(3)));
    vi.advanceTimersByTime(20);
    expect(panel.dataset.drawMs).toBeDefined();
    model.update("layers", [...LAYERS, "extra"]);
    vi.advanceTimersByTime(20);
    expect(el.querySelectorAll(".ndbg-map-label")).toHaveLength(5);
  });

  it("shows the inspector HTML from Python and closes it", () => {
    mount();
    $('.ndbg-event[data-id="1"]').click();
    model.update("inspector_html", '<div class="probe">weights of linear1</div>');
    vi.advanceTimersByTime(20);
    expect($(".ndbg-inspector").hidden).toBe(false);
    expect($(".ndbg-inspector-body .probe").textContent).toBe("weights of linear1");
    expect($(".ndbg-inspector-status").textContent).toBe("");
    $(".ndbg-inspector-close").click();
    expect($(".ndbg-inspector").hidden).toBe(true);
    expect(model.values.selected).toBeNull();
    // Reopening the same selection shows its HTML without waiting for the kernel.
    $('.ndbg-event[data-id="1"]').click();
    expect($(".ndbg-inspector").hidden).toBe(false);
    expect($(".ndbg-inspector-status").textContent).toBe("");
  });

  it("says the likely causes under the first failure, and follows them", () => {
    const cause = "the learning rate went 0.05 -> 0.5 at step 40, 2 steps before: a likely cause";
    mount({ likely_causes: [cause] });
    const box = $(".ndbg-first-failure-causes");
    expect(box.hidden).toBe(false);
    expect([...box.querySelectorAll(".ndbg-likely-cause")].map((n) => n.textContent)).toEqual([cause]);
    model.update("likely_causes", []);
    vi.advanceTimersByTime(20); // the next frame
    expect(box.hidden).toBe(true);
    expect(box.children).toHaveLength(0);
  });

  it("shows no likely cause without a first failure", () => {
    mount({ first_failure: null, likely_causes: ["stale"] });
    expect($(".ndbg-first-failure-causes").hidden).toBe(true);
  });

  it("caps a long feed with a line that shows more", () => {
    const events = Array.from({ length: 500 }, (_, i): PanelEvent => ({
      id: i, step: i, layer: `l${i}`, kind: "saturation", severity: "warning", message: `m${i}`, symptom_of: null,
    }));
    mount({ events, first_failure: null });
    expect(el.querySelectorAll(".ndbg-event")).toHaveLength(200);
    expect($(".ndbg-feed-more").textContent).toContain("300 more");
    $(".ndbg-feed-more").click();
    expect(el.querySelectorAll(".ndbg-event")).toHaveLength(400);
    expect($(".ndbg-first-failure").hidden).toBe(true);
  });

  it("survives empty traits (a panel created before the first step)", () => {
    mount({
      layers: [], step: 0, status: "training", loss: null, map: null, map_cols: 0, map_steps: [0, 0],
      map_values: null, map_act: null, markers: [], first_failure: null, events: [], message: "",
      cost: "", cost_detail: "", notes: [], baseline: null,
    });
    expect($(".ndbg-feed-empty").textContent).toBe("no events yet");
    expect($(".ndbg-notes").hidden).toBe(true);
    expect($(".ndbg-cost").hidden).toBe(true); // not measured yet
    expect($(".ndbg-loss-value").textContent).toBe("\u2014");
    expect($(".ndbg-map").classList.contains("ndbg-map-is-empty")).toBe(true);
  });

  it("shows the run's notes under the header, one line each, and follows them", () => {
    mount();
    expect($(".ndbg-notes").hidden).toBe(true);
    const stopped = "neuraldbg stopped watching at step 12: its own code failed (post: RuntimeError: boom).";
    const compiled = "parts of the model ran under torch.compile: their activations are not watched";
    model.update("notes", [stopped, compiled]);
    vi.advanceTimersByTime(20); // the next frame
    const lines = [...el.querySelectorAll<HTMLElement>(".ndbg-note")].map((n) => n.textContent);
    expect(lines).toEqual([stopped, compiled]);
    expect($(".ndbg-notes").hidden).toBe(false);
    model.update("notes", []);
    vi.advanceTimersByTime(20); // the next frame
    expect(el.querySelectorAll(".ndbg-note")).toHaveLength(0);
    expect($(".ndbg-notes").hidden).toBe(true);
  });

  it("cleans up its listeners", () => {
    mount();
    expect(model.listenerCount()).toBeGreaterThan(0);
    cleanup();
    expect(model.listenerCount()).toBe(0);
    expect(el.querySelector(".ndbg-panel")).toBeNull();
    cleanup = () => {};
  });
});
