import { afterEach, describe, expect, it, vi } from "vitest";
import { LIGHT, stateLut } from "../colors";
import { createHeatmap, fillCells, MAX_VIEW_HEIGHT, ROW_HEIGHT } from "../heatmap";
import { snapshot, TRAITS } from "../model";
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

  it("shows a legend with the four states and an empty note without layers", () => {
    const { host, view } = setup([], 0);
    view.draw();
    expect(host.querySelectorAll(".ndbg-legend-item")).toHaveLength(5);
    expect(host.querySelector(".ndbg-legend-error")).not.toBeNull();
    expect(host.querySelector(".ndbg-map")!.classList.contains("ndbg-map-is-empty")).toBe(true);
  });
});

/** A 2D context that records calls (happy-dom has no canvas). */
function recordingContext() {
  const calls: { name: string; args: unknown[] }[] = [];
  const target: Record<string, unknown> = {
    createImageData: (w: number, h: number) => ({ width: w, height: h, data: new Uint8ClampedArray(w * h * 4) }),
  };
  const ctx = new Proxy(target, {
    get(t, key: string) {
      if (key in t) return t[key];
      return (...args: unknown[]) => calls.push({ name: key, args });
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
