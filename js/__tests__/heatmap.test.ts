import { afterEach, describe, expect, it, vi } from "vitest";
import { LIGHT, stateLut } from "../colors";
import {
  cellSpan,
  createHeatmap,
  fillCells,
  type HeatmapView,
  MARKER_HEIGHT,
  MAX_VIEW_HEIGHT,
  MIN_ALERT_WIDTH,
  ROW_HEIGHT,
  stateRuns,
} from "../heatmap";
import { snapshot, TRAITS, type PanelTraits } from "../model";
import { FakeModel } from "./fake-model";

describe("fillCells", () => {
  it("writes one packed pixel per cell and pads missing cells as no data", () => {
    const lut = stateLut(LIGHT);
    const out = new Uint32Array(6);
    fillCells(new Uint8Array([0, 1, 2, 3]), lut, out);
    expect(Array.from(out)).toEqual([lut[0], lut[1], lut[2], lut[3], lut[0], lut[0]]);
  });

  it("paints 1000 layers x 300 columns well inside a frame", () => {
    const rows = 1000;
    const cols = 300;
    const map = new Uint8Array(rows * cols).map((_, i) => i % 4);
    const lut = stateLut(LIGHT);
    const out = new Uint32Array(rows * cols);
    const times: number[] = [];
    for (let k = 0; k < 7; k++) {
      const t0 = performance.now();
      fillCells(map, lut, out);
      times.push(performance.now() - t0);
    }
    times.sort((a, b) => a - b);
    expect(times[3]).toBeLessThan(16);
    expect(out[rows * cols - 1]).toBe(lut[(rows * cols - 1) % 4]);
  });
});

describe("cellSpan / stateRuns (alert cells at a minimum visible width)", () => {
  it("widens a one-step error in a long run to MIN_ALERT_WIDTH, about the cell's center", () => {
    // 240 columns over 780 px: 3.25 px a column, the screenshot's ~3 px sliver.
    const cellW = 780 / 240;
    const [x0, x1] = cellSpan(150, 151, cellW, 780);
    expect(MIN_ALERT_WIDTH).toBeGreaterThanOrEqual(3);
    expect(x1 - x0).toBeGreaterThanOrEqual(MIN_ALERT_WIDTH);
    const center = 150.5 * cellW;
    expect(x0).toBeLessThanOrEqual(center);
    expect(x1).toBeGreaterThanOrEqual(center);
    expect(Math.abs((x0 + x1) / 2 - center)).toBeLessThanOrEqual(1);
  });

  it("keeps wide cells as they are and alert cells at the edges inside the map", () => {
    expect(cellSpan(2, 3, 20, 200)).toEqual([40, 60]);
    expect(cellSpan(0, 1, 1, 300)).toEqual([0, MIN_ALERT_WIDTH]);
    expect(cellSpan(299, 300, 1, 300)).toEqual([300 - MIN_ALERT_WIDTH, 300]);
  });

  it("merges adjacent cells of a state into one run per row", () => {
    const cols = 300;
    const map = new Uint8Array(2 * cols).fill(1);
    map[cols + 10] = 3;
    map[cols + 11] = 3;
    map[cols + 12] = 3;
    map[cols + 200] = 3;
    map[cols + 201] = 2;
    expect(stateRuns(map, 0, cols, 3, 2, 600)).toEqual([]);
    const runs = stateRuns(map, 1, cols, 3, 2, 600);
    expect(runs).toEqual([20, 26, 399, 403]);
    for (let k = 0; k < runs.length; k += 2) expect(runs[k + 1]! - runs[k]!).toBeGreaterThanOrEqual(MIN_ALERT_WIDTH);
    expect(stateRuns(map, 1, cols, 2, 2, 600)).toEqual([401, 405]);
  });
});

describe("createHeatmap", () => {
  function setup(layers: string[], cols: number) {
    const model = new FakeModel({ layers, map_cols: cols, map_steps: [0, cols * 10], map: new DataView(new ArrayBuffer(layers.length * cols)) });
    const host = document.createElement("div");
    document.body.appendChild(host);
    const clicks: unknown[] = [];
    const view = createHeatmap(host, { onCellClick: (c) => clicks.push(c), requestDraw: () => {} });
    view.update(snapshot(model.asModel()), new Set(TRAITS));
    return { host, view, clicks };
  }

  it("labels every row, truncating long names from the left with the full name as title", () => {
    const long = "encoder.layers.11.self_attention.out_projection.linear";
    const { host } = setup(["fc1", long], 10);
    const labels = host.querySelectorAll<HTMLElement>(".ndbg-map-label");
    expect(labels).toHaveLength(2);
    expect(labels[1]!.title).toBe(long);
    expect(labels[1]!.textContent!.startsWith("\u2026")).toBe(true);
    expect(labels[1]!.textContent!.endsWith("out_projection.linear")).toBe(true);
  });

  it("caps the visible height and scrolls 1000 layers", () => {
    const layers = Array.from({ length: 1000 }, (_, i) => `blocks.${i}.fc`);
    const { host, view } = setup(layers, 300);
    view.draw();
    const scroll = host.querySelector<HTMLElement>(".ndbg-map-scroll")!;
    const body = host.querySelector<HTMLElement>(".ndbg-map-body")!;
    const canvas = host.querySelector<HTMLCanvasElement>(".ndbg-map-canvas")!;
    expect(scroll.style.maxHeight).toBe(`${MAX_VIEW_HEIGHT}px`);
    expect(body.style.height).toBe(`${1000 * ROW_HEIGHT}px`);
    expect(canvas.style.height).toBe(`${MAX_VIEW_HEIGHT}px`);
    expect(host.querySelectorAll(".ndbg-map-label")).toHaveLength(1000);
  });

  it("maps points to cells, through the scroll offset", () => {
    const layers = Array.from({ length: 100 }, (_, i) => `l${i}`);
    const { host, view } = setup(layers, 10);
    // Without layout the width falls back to 600 px: 60 px per column.
    expect(view.cellAt(0, 0)).toEqual({ row: 0, col: 0 });
    expect(view.cellAt(125, 3 * ROW_HEIGHT + 1)).toEqual({ row: 3, col: 2 });
    host.querySelector<HTMLElement>(".ndbg-map-scroll")!.scrollTop = 10 * ROW_HEIGHT;
    expect(view.cellAt(125, 1)).toEqual({ row: 10, col: 2 });
    expect(view.cellAt(-1, 1)).toBeNull();
    expect(view.cellAt(700, 1)).toBeNull();
  });

  it("puts the axis' middle step over its own column", () => {
    const { host } = setup(["a", "b"], 30); // steps 0-299
    const ticks = Array.from(host.querySelectorAll<HTMLElement>(".ndbg-map-tick"));
    expect(ticks.map((t) => t.textContent)).toEqual(["step 0", "150", "299"]);
    expect(Number.parseFloat(ticks[1]!.style.left)).toBeCloseTo((150.5 / 300) * 100, 5);
  });

  it("shows a legend with the four states and an empty note without layers", () => {
    const { host, view } = setup([], 0);
    view.draw();
    expect(host.querySelectorAll(".ndbg-legend-item")).toHaveLength(5);
    expect(host.querySelector(".ndbg-legend-error")).not.toBeNull();
    expect(host.querySelector(".ndbg-map")!.classList.contains("ndbg-map-is-empty")).toBe(true);
  });
});

/** A 2D context that records calls, with the styles set at the time (happy-dom has no canvas). */
function recordingContext() {
  const calls: { name: string; args: unknown[]; fillStyle?: unknown; strokeStyle?: unknown; lineWidth?: unknown }[] = [];
  const target: Record<string, unknown> = {
    createImageData: (w: number, h: number) => ({ width: w, height: h, data: new Uint8ClampedArray(w * h * 4) }),
  };
  const ctx = new Proxy(target, {
    get(t, key: string) {
      if (key in t) return t[key];
      return (...args: unknown[]) =>
        calls.push({ name: key, args, fillStyle: t.fillStyle, strokeStyle: t.strokeStyle, lineWidth: t.lineWidth });
    },
    set(t, key: string, value) {
      t[key] = value;
      return true;
    },
  });
  return { ctx, calls };
}

describe("heatmap painting", () => {
  afterEach(() => {
    vi.restoreAllMocks();
  });

  it("paints cells once, then draws only the visible rows with one drawImage", () => {
    const contexts: ReturnType<typeof recordingContext>[] = [];
    const byCanvas = new WeakMap<HTMLCanvasElement, ReturnType<typeof recordingContext>>();
    vi.spyOn(HTMLCanvasElement.prototype, "getContext").mockImplementation(function (this: HTMLCanvasElement) {
      let rec = byCanvas.get(this);
      if (!rec) {
        rec = recordingContext();
        byCanvas.set(this, rec);
        contexts.push(rec);
      }
      return rec.ctx as unknown as CanvasRenderingContext2D;
    });
    const rows = 1000;
    const cols = 300;
    const map = new Uint8Array(rows * cols).fill(1);
    map[500 * cols + 7] = 3;
    const model = new FakeModel({
      layers: Array.from({ length: rows }, (_, i) => `l${i}`),
      map_cols: cols,
      map_steps: [0, 3000],
      map: new DataView(map.buffer),
      markers: [
        { row: 2, step: 75, kind: "regime_shift", severity: "error" },
        { row: 900, step: 10, kind: "dead_units", severity: "warning" },
      ],
    });
    const host = document.createElement("div");
    document.body.appendChild(host);
    const view = createHeatmap(host, { onCellClick: () => {}, requestDraw: () => {} });
    view.update(snapshot(model.asModel()), new Set(TRAITS));
    expect(view.draw()).toBeGreaterThanOrEqual(0);

    // Cells go through one putImageData on the (cols x rows) image.
    const puts = contexts.flatMap((c) => c.calls).filter((c) => c.name === "putImageData");
    expect(puts).toHaveLength(1);
    const image = puts[0]!.args[0] as ImageData;
    expect([image.width, image.height]).toEqual([cols, rows]);
    const pixels = new Uint32Array(image.data.buffer);
    const lut = stateLut(LIGHT);
    expect(pixels[500 * cols + 7]).toBe(lut[3]);
    expect(pixels[0]).toBe(lut[1]);

    const visible = contexts.map((c) => c.calls).find((calls) => calls.some((c) => c.name === "drawImage"))!;
    const draws = visible.filter((c) => c.name === "drawImage");
    expect(draws).toHaveLength(1);
    const [, sx, sy, sw, sh] = draws[0]!.args as number[];
    expect([sx, sy, sw]).toEqual([0, 0, cols]);
    expect(sh).toBeLessThanOrEqual(MAX_VIEW_HEIGHT / ROW_HEIGHT + 1);
    // Only the marker on a visible row is drawn (one triangle: one fill).
    expect(visible.filter((c) => c.name === "fill")).toHaveLength(1);

    // Scrolling repaints from the same image: no new putImageData.
    host.querySelector<HTMLElement>(".ndbg-map-scroll")!.scrollTop = 495 * ROW_HEIGHT;
    view.draw();
    expect(contexts.flatMap((c) => c.calls).filter((c) => c.name === "putImageData")).toHaveLength(1);
    const last = visible.filter((c) => c.name === "drawImage").at(-1)!;
    expect(last.args[2]).toBe(495);
  });
});

describe("heatmap painting: a failure stays visible", () => {
  afterEach(() => {
    vi.restoreAllMocks();
  });

  /** A context whose methods do nothing: times the panel's own work, not the recorder's. */
  function silentContext() {
    const noop = (): void => {};
    const ctx = {
      createImageData: (w: number, h: number) => ({ width: w, height: h, data: new Uint8ClampedArray(w * h * 4) }),
      putImageData: noop, drawImage: noop, clearRect: noop, fillRect: noop, strokeRect: noop, setTransform: noop,
      beginPath: noop, moveTo: noop, lineTo: noop, closePath: noop, fill: noop,
    };
    return { ctx, calls: [] as ReturnType<typeof recordingContext>["calls"] };
  }

  function paint(values: Partial<PanelTraits>, prepare?: (view: HeatmapView, host: HTMLElement) => void, silent = false) {
    const recs: ReturnType<typeof recordingContext>[] = [];
    const byCanvas = new WeakMap<HTMLCanvasElement, ReturnType<typeof recordingContext>>();
    vi.spyOn(HTMLCanvasElement.prototype, "getContext").mockImplementation(function (this: HTMLCanvasElement) {
      let rec = byCanvas.get(this);
      if (!rec) {
        rec = (silent ? silentContext() : recordingContext()) as ReturnType<typeof recordingContext>;
        byCanvas.set(this, rec);
        recs.push(rec);
      }
      return rec.ctx as unknown as CanvasRenderingContext2D;
    });
    const model = new FakeModel(values);
    const host = document.createElement("div");
    document.body.appendChild(host);
    const view = createHeatmap(host, { onCellClick: () => {}, requestDraw: () => {} });
    view.update(snapshot(model.asModel()), new Set(TRAITS));
    prepare?.(view, host);
    const ms = view.draw();
    const visible = recs.map((r) => r.calls).find((calls) => calls.some((c) => c.name === "drawImage")) ?? [];
    return { visible, ms, view, host, model };
  }


  // 5 layers x 240 columns over the 600 px fallback width: 2.5 px a column.
  const COLS = 240;
  const WIDTH = 600;
  const cellW = WIDTH / COLS;
  function traits(): Partial<PanelTraits> {
    const map = new Uint8Array(5 * COLS).fill(1);
    map[2 * COLS + 120] = 3; // layer 2, steps 150-151 of 300
    map[0 * COLS + 120] = 2;
    return {
      layers: ["0", "1", "2", "3", "4"],
      map_cols: COLS,
      map_steps: [0, 300],
      map: new DataView(map.buffer),
      markers: [
        { row: 2, step: 150, kind: "regime_shift", severity: "error" },
        { row: 2, step: 150, kind: "exploding_update", severity: "error" },
      ],
      selected: { layer: "2", step: 150 },
    };
  }

  it("draws a narrow error cell at least MIN_ALERT_WIDTH wide, in the error color", () => {
    const { visible } = paint(traits());
    const errors = visible.filter((c) => c.name === "fillRect" && c.fillStyle === LIGHT.states[3]);
    expect(errors).toHaveLength(1);
    const [x, y, w, h] = errors[0]!.args as [number, number, number, number];
    const center = 120.5 * cellW;
    expect(w).toBeGreaterThanOrEqual(3);
    expect(w).toBeGreaterThanOrEqual(MIN_ALERT_WIDTH);
    expect(x).toBeLessThanOrEqual(center);
    expect(x + w).toBeGreaterThanOrEqual(center);
    expect([y, h]).toEqual([2 * ROW_HEIGHT, ROW_HEIGHT]);
    // The warning on row 0 too, drawn before the errors (errors win where they meet).
    const warn = visible.findIndex((c) => c.name === "fillRect" && c.fillStyle === LIGHT.states[2]);
    expect(warn).toBeGreaterThanOrEqual(0);
    expect(warn).toBeLessThan(visible.indexOf(errors[0]!));
  });

  it("draws markers as small notches on the row's top edge, not over the cell", () => {
    const { visible } = paint(traits());
    const fills = visible.filter((c) => c.name === "fill");
    expect(fills).toHaveLength(1); // every marker in one path
    expect(fills[0]!.fillStyle).toBe(LIGHT.ink);
    const ys = visible.filter((c) => c.name === "moveTo" || c.name === "lineTo").map((c) => c.args[1] as number);
    expect(Math.min(...ys)).toBeGreaterThanOrEqual(2 * ROW_HEIGHT);
    expect(Math.max(...ys)).toBeLessThanOrEqual(2 * ROW_HEIGHT + 1 + MARKER_HEIGHT);
    expect(MARKER_HEIGHT).toBeLessThanOrEqual(ROW_HEIGHT / 3);
  });

  it("frames the selected cell from outside, in the selection color", () => {
    const { visible } = paint(traits());
    const frames = visible.filter((c) => c.name === "strokeRect");
    expect(frames).toHaveLength(1);
    expect(frames[0]!.strokeStyle).toBe(LIGHT.select);
    const line = frames[0]!.lineWidth as number;
    const [x, y, w, h] = frames[0]!.args as [number, number, number, number];
    const [x0, x1] = cellSpan(120, 121, cellW, WIDTH);
    // The stroke's inner edge lies outside the drawn cell on every side.
    expect(x + line / 2).toBeLessThanOrEqual(x0);
    expect(x + w - line / 2).toBeGreaterThanOrEqual(x1);
    expect(y + line / 2).toBeLessThanOrEqual(2 * ROW_HEIGHT + 1);
    expect(y + h - line / 2).toBeGreaterThanOrEqual(3 * ROW_HEIGHT);
  });

  it("draws no frame for a selected row scrolled out of view", () => {
    const layers = Array.from({ length: 100 }, (_, i) => `l${i}`);
    const { visible } = paint(
      { layers, map_cols: 10, map_steps: [0, 100], map: new DataView(new Uint8Array(1000).fill(1).buffer), selected: { layer: "l0", step: 5 } },
      (_view, host) => {
        host.querySelector<HTMLElement>(".ndbg-map-scroll")!.scrollTop = 50 * ROW_HEIGHT;
      },
    );
    expect(visible.filter((c) => c.name === "strokeRect")).toHaveLength(0);
  });

  it("keeps the draw of 1000 layers x 300 columns full of alerts well inside a frame", () => {
    const rows = 1000;
    const cols = 300;
    const map = new Uint8Array(rows * cols).map((_, i) => (i % 2 === 0 ? 3 : i % 3 === 0 ? 2 : 1));
    // Every other cell an error, every sixth a warning: the most alert runs a row can hold.
    const { ms, view, model } = paint(
      {
        layers: Array.from({ length: rows }, (_, i) => `l${i}`),
        map_cols: cols,
        map_steps: [0, 3000],
        map: new DataView(map.buffer),
        markers: Array.from({ length: 200 }, (_, i) => ({ row: i % 40, step: i * 15, kind: "regime_shift", severity: "error" as const })),
        selected: { layer: "l3", step: 40 },
      },
      undefined,
      true,
    );
    expect(ms).toBeGreaterThanOrEqual(0); // the first draw also creates canvases and the legend
    // A repaint (scroll, hover, selection) and a data change (the cells image rebuilt),
    // after a warm-up: the lower quartile of 11 tries, so a busy CI machine (test files
    // run in parallel) does not fail it while a slow draw still does.
    const snap = snapshot(model.asModel());
    const redraw = (data: boolean): number => {
      if (data) view.update(snap, new Set(["map"] as const));
      return view.draw();
    };
    const median = (data: boolean): number => {
      for (let k = 0; k < 3; k++) redraw(data);
      const times = Array.from({ length: 11 }, () => redraw(data)).sort((a, b) => a - b);
      return times[2]!;
    };
    expect(median(false)).toBeLessThan(16);
    expect(median(true)).toBeLessThan(16);
  });
});
