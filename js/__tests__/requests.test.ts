import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import widget from "../index";
import { partingCell } from "../heatmap";
import type { Baseline, PanelTraits } from "../model";
import { createRequests, KERNEL_GONE, managerKernelGone, NO_ANSWER, REQUEST_TIMEOUT_MS, type RequestKind } from "../requests";
import { FakeModel, f32, u8 } from "./fake-model";
import { DEFAULTS, SLIDER_SPECS } from "./slider-specs";

const LAYERS = ["0", "1", "2"];
const COLS = 10;

function traits(over: Partial<PanelTraits> = {}): PanelTraits {
  const map = new Array(LAYERS.length * COLS).fill(1);
  map[1 * COLS + 5] = 3;
  return {
    layers: LAYERS, status: "finished", step: 40, loss: f32([1, 0.9, 0.8]), map: u8(map), map_cols: COLS,
    map_steps: [0, 40], map_values: f32(new Array(LAYERS.length * COLS).fill(-1)),
    map_act: f32(new Array(LAYERS.length * COLS).fill(0)), markers: [],
    first_failure: { id: 0, step: 21, layer: "1", kind: "exploding_gradient", severity: "error", message: "1: gradient norm 3e4 at step 21" },
    likely_causes: [],
    events: [{ id: 0, step: 21, layer: "1", kind: "exploding_gradient", severity: "error", message: "1: gradient norm 3e4 at step 21", symptom_of: null }],
    thresholds: { ...DEFAULTS }, sliders: [...SLIDER_SPECS], selected: null, inspector_html: "", message: "",
    cost: "", cost_detail: "", notes: [], baseline: null, ...over,
  };
}

beforeEach(() => {
  vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout", "requestAnimationFrame", "cancelAnimationFrame", "performance"] });
});

afterEach(() => {
  vi.useRealTimers();
});

describe("createRequests", () => {
  function setup(timed = true) {
    const model = new FakeModel(traits());
    const log: string[] = [];
    const requests = createRequests(model.asModel(), {
      timed: () => timed,
      onTimeout: (k: RequestKind) => log.push(`timeout ${k}`),
      onAnswer: (k: RequestKind) => log.push(`answer ${k}`),
      onGone: () => log.push("gone"),
    });
    return { model, log, requests };
  }

  it("times a request out when Python does not answer", () => {
    const { log, requests } = setup();
    requests.ask("selected");
    vi.advanceTimersByTime(REQUEST_TIMEOUT_MS - 1);
    expect(log).toEqual([]);
    vi.advanceTimersByTime(1);
    expect(log).toEqual(["timeout selected"]);
    expect(requests.pending("selected")).toBe(true); // a late answer still lands
  });

  it("is answered by Python's acknowledgement, in time or late", () => {
    const { model, log, requests } = setup();
    requests.ask("thresholds");
    model.emit("msg:custom", { answer: "thresholds" });
    vi.advanceTimersByTime(2 * REQUEST_TIMEOUT_MS);
    expect(log).toEqual(["answer thresholds"]);
    requests.ask("selected");
    vi.advanceTimersByTime(REQUEST_TIMEOUT_MS);
    model.emit("msg:custom", { answer: "selected" });
    expect(log).toEqual(["answer thresholds", "timeout selected", "answer selected"]);
    expect(requests.pending("selected")).toBe(false);
    model.emit("msg:custom", { something: "else" }); // other messages are not answers
    expect(log).toHaveLength(3);
  });

  it("does not time requests made while the cell trains (the kernel reads them at its end)", () => {
    const { log, requests } = setup(false);
    requests.ask("selected");
    vi.advanceTimersByTime(10 * REQUEST_TIMEOUT_MS);
    expect(log).toEqual([]);
    expect(requests.pending("selected")).toBe(true);
  });

  for (const event of ["comm_live_update", "destroy"]) {
    it(`knows the kernel is gone on ${event}, once, and answers later requests at once`, () => {
      const { model, log, requests } = setup();
      requests.ask("selected");
      model.emit(event);
      model.emit(event);
      expect(log).toEqual(["gone"]);
      expect(requests.gone).toBe(true);
      vi.advanceTimersByTime(REQUEST_TIMEOUT_MS); // the pending timer was dropped
      expect(log).toEqual(["gone"]);
      requests.ask("thresholds");
      expect(log).toEqual(["gone", "timeout thresholds"]);
    });
  }

  it("takes a send that throws for a kernel that is gone", () => {
    const { log, requests } = setup();
    requests.send(() => {
      throw new Error("Kernel is dead");
    });
    expect(log).toEqual(["gone"]);
    let sent = false;
    requests.send(() => (sent = true));
    expect(sent).toBe(false);
  });

  it("reads a shut-down kernel from the widget manager, which tells the models nothing", () => {
    expect(managerKernelGone({ widget_manager: { kernel: null } })).toBe(true);
    expect(managerKernelGone({ widget_manager: { kernel: { status: "dead" } } })).toBe(true);
    expect(managerKernelGone({ widget_manager: { kernel: { status: "idle" } } })).toBe(false);
    // a manager that has no notion of a kernel (other front ends) says nothing
    expect(managerKernelGone({ widget_manager: {} })).toBe(false);
    expect(managerKernelGone({})).toBe(false);
  });

  it("stops listening when disposed", () => {
    const { model, requests } = setup();
    const before = model.listenerCount();
    requests.dispose();
    expect(model.listenerCount()).toBe(before - 3);
  });
});

describe("the panel when the kernel does not answer or is gone", () => {
  let model: FakeModel;
  let el: HTMLElement;
  let cleanup: () => void;

  function mount(over: Partial<PanelTraits> = {}): void {
    model = new FakeModel(traits(over));
    el = document.createElement("div");
    document.body.appendChild(el);
    cleanup = widget.render({ model: model.asModel(), el });
  }
  function $(selector: string): HTMLElement {
    const node = el.querySelector<HTMLElement>(selector);
    if (!node) throw new Error(`no ${selector}`);
    return node;
  }

  afterEach(() => {
    cleanup?.();
    el?.remove();
  });

  it("a click with no answer says the kernel does not answer, in the stated time", () => {
    mount();
    $(".ndbg-first-failure").click();
    expect($(".ndbg-inspector-status").textContent).toMatch(/waiting/);
    expect($(".ndbg-alert").hidden).toBe(true);
    vi.advanceTimersByTime(REQUEST_TIMEOUT_MS);
    expect($(".ndbg-alert").hidden).toBe(false);
    expect($(".ndbg-alert").textContent).toBe(NO_ANSWER);
    expect($(".ndbg-inspector").hidden).toBe(false);
    expect($(".ndbg-inspector-status").textContent).toBe("no answer from the kernel");
    // The answer comes after all: it lands and the message goes.
    model.update("inspector_html", "<p>charts</p>");
    model.emit("msg:custom", { answer: "selected" });
    vi.advanceTimersByTime(20);
    expect($(".ndbg-alert").hidden).toBe(true);
    expect($(".ndbg-inspector-body").innerHTML).toBe("<p>charts</p>");
  });

  it("a click answered in time shows no message", () => {
    mount();
    $(".ndbg-first-failure").click();
    vi.advanceTimersByTime(100);
    model.update("inspector_html", "<p>charts</p>");
    model.emit("msg:custom", { answer: "selected" });
    vi.advanceTimersByTime(2 * REQUEST_TIMEOUT_MS);
    expect($(".ndbg-alert").hidden).toBe(true);
  });

  it("a slider with no answer stops saying it re-classifies and says why", () => {
    mount();
    const input = el.querySelector<HTMLInputElement>(".ndbg-slider-dead")!;
    input.value = "0";
    input.dispatchEvent(new Event("change"));
    expect($(".ndbg-panel").dataset.reclassifying).toBe("true");
    vi.advanceTimersByTime(REQUEST_TIMEOUT_MS);
    expect($(".ndbg-panel").dataset.reclassifying).toBe("false");
    expect($(".ndbg-alert").textContent).toBe(NO_ANSWER);
  });

  it("a click during training waits for the cell's end without a timeout", () => {
    mount({ status: "training" });
    $(".ndbg-first-failure").click();
    vi.advanceTimersByTime(10 * REQUEST_TIMEOUT_MS);
    expect($(".ndbg-alert").hidden).toBe(true);
    expect($(".ndbg-inspector-status").textContent).toMatch(/waiting/);
  });

  it("says the kernel is gone when the comm is lost, marks the panel for the static copy, and answers clicks at once", () => {
    mount();
    $(".ndbg-first-failure").click(); // waiting when the kernel goes
    model.emit("comm_live_update");
    expect($(".ndbg-panel").classList.contains("ndbg-gone")).toBe(true);
    expect($(".ndbg-panel").dataset.kernel).toBe("gone");
    expect($(".ndbg-alert").textContent).toBe(KERNEL_GONE);
    expect($(".ndbg-inspector-status").textContent).toBe("the kernel is gone");
    $(".ndbg-inspector-close").click();
    const saves = model.saves;
    el.querySelector<HTMLElement>('.ndbg-event[data-id="0"]')!.click();
    expect($(".ndbg-inspector-status").textContent).toBe("the kernel is gone");
    expect($(".ndbg-alert").textContent).toBe(KERNEL_GONE);
    expect(model.saves).toBe(saves); // nothing is sent to a kernel that is gone
  });

  it("a click on a panel whose kernel was shut down says it is gone at once", () => {
    mount();
    const manager: { kernel: { status: string } | null } = { kernel: { status: "idle" } };
    (model as unknown as { widget_manager: unknown }).widget_manager = manager;
    $(".ndbg-first-failure").click();
    model.update("inspector_html", "<p>charts</p>");
    model.emit("msg:custom", { answer: "selected" });
    expect($(".ndbg-alert").hidden).toBe(true);
    vi.advanceTimersByTime(20); // a frame: the inspector shows the answer
    expect($(".ndbg-inspector-body").innerHTML).toBe("<p>charts</p>");
    manager.kernel = null; // Kernel > Shut Down Kernel
    expect($(".ndbg-alert").hidden).toBe(true); // nothing asked yet, nothing known
    // another cell of the map: a request, which finds the kernel gone
    $(".ndbg-map-canvas").dispatchEvent(new MouseEvent("click", { clientX: 5, clientY: 2, bubbles: true }));
    expect($(".ndbg-inspector-status").textContent).toBe("the kernel is gone");
    expect($(".ndbg-alert").textContent).toBe(KERNEL_GONE);
    expect($(".ndbg-panel").classList.contains("ndbg-gone")).toBe(true);
  });

  it("a save that throws (no comm) marks the kernel gone instead of breaking the click", () => {
    mount();
    model.save_changes = () => {
      throw new Error("Syncing error: no comm channel defined");
    };
    expect(() => $(".ndbg-first-failure").click()).not.toThrow();
    expect($(".ndbg-alert").textContent).toBe(KERNEL_GONE);
  });
});

describe("a baseline run beside the map", () => {
  const BASE: Baseline = {
    name: "yesterday.npz",
    sentence: "neuraldbg compare yesterday.npz vs run (40 common steps, 3 common layers): they part at step 21, layer 1: gradient norm 0.5 vs 3e4 (beyond their noise: 0.5 decades)",
    step: 21, layer: "1", quantity: "grad_norm", row: 1,
    only_run: [{ step: 21, layer: "1", kind: "exploding_gradient", severity: "error", message: "1: gradient norm 3e4 at step 21" }],
    only_baseline: [],
  };
  let model: FakeModel;
  let el: HTMLElement;
  let cleanup: () => void;

  afterEach(() => {
    cleanup?.();
    el?.remove();
  });

  it("places the parting on the map: its cell, or the whole column for the loss", () => {
    const s = { baseline: BASE, mapSteps: [0, 40] as [number, number], mapCols: COLS, layers: LAYERS };
    expect(partingCell(s)).toEqual({ row: 1, col: 5 });
    expect(partingCell({ ...s, baseline: { ...BASE, layer: null, row: -1 } })).toEqual({ row: -1, col: 5 });
    expect(partingCell({ ...s, baseline: { ...BASE, step: null, layer: null } })).toBeNull();
    expect(partingCell({ ...s, baseline: null })).toBeNull();
  });

  it("shows where the runs part and the events only one has; a click inspects the parting", () => {
    model = new FakeModel(traits());
    el = document.createElement("div");
    document.body.appendChild(el);
    cleanup = widget.render({ model: model.asModel(), el });
    const box = el.querySelector<HTMLElement>(".ndbg-baseline")!;
    expect(box.hidden).toBe(true);
    model.update("baseline", BASE);
    vi.advanceTimersByTime(20);
    expect(box.hidden).toBe(false);
    expect(box.textContent).toContain("compared with yesterday.npz");
    expect(box.querySelector(".ndbg-baseline-parting")!.textContent).toBe("parts at step 21, layer 1");
    expect(box.querySelector(".ndbg-baseline-sentence")!.textContent).toBe(BASE.sentence);
    expect(box.querySelector(".ndbg-baseline-only-run")!.textContent).toContain("gradient norm 3e4 at step 21");
    expect(box.querySelector(".ndbg-baseline-only-base")).toBeNull();
    box.querySelector<HTMLElement>(".ndbg-baseline-parting")!.click();
    expect(model.values.selected).toEqual({ layer: "1", step: 21 });
  });

  it("says so where the runs do not part", () => {
    model = new FakeModel(traits({ baseline: { ...BASE, step: null, layer: null, quantity: null, row: -1, only_run: [], sentence: "... they do not part (every key number stays within their noise)" } }));
    el = document.createElement("div");
    document.body.appendChild(el);
    cleanup = widget.render({ model: model.asModel(), el });
    const box = el.querySelector<HTMLElement>(".ndbg-baseline")!;
    expect(box.hidden).toBe(false);
    expect(box.dataset.parts).toBe("false");
    expect(box.querySelector(".ndbg-baseline-parting")).toBeNull();
    expect(box.textContent).toContain("do not part");
  });
});
