/**
 * The health map: one row per layer (forward order, top to bottom), one column per step
 * bucket. Cells are painted once per data change into a cols x rows pixel image
 * (ImageData + putImageData, one uint32 write per cell) and scaled onto the visible canvas
 * with one drawImage; scrolling and hovering only repeat that drawImage. The canvas is as
 * tall as the viewport (rows scroll beneath it), so 1000 layers cost what 30 do.
 */
import { bucketOf, rangeLabel, stepRange } from "./bucketing";
import { isDarkTheme, paletteFor, stateLut, stateName, type Palette } from "./colors";
import { formatLog10, truncateLeft } from "./format";
import type { Selection, Snapshot, TraitName } from "./model";

export const ROW_HEIGHT = 14;
export const MAX_VIEW_HEIGHT = 30 * ROW_HEIGHT;
/** Label column width, in characters of the monospace label font. */
export const MAX_LABEL_CHARS = 32;
const FALLBACK_WIDTH = 600;

export interface Cell {
  row: number;
  col: number;
}

export interface HeatmapView {
  readonly el: HTMLElement;
  /** Take new data; `changed` names the traits that changed since the last update. */
  update(snap: Snapshot, changed: ReadonlySet<TraitName>): void;
  /** Paint the canvas; returns the time it took in ms. */
  draw(): number;
  /** The cell under a point given relative to the canvas' top-left corner (CSS px). */
  cellAt(x: number, y: number): Cell | null;
  dispose(): void;
}

export interface HeatmapOptions {
  /** Called on a click on a cell. */
  onCellClick(cell: Cell): void;
  /** Ask for a redraw on the next frame (scroll, hover, resize). */
  requestDraw(): void;
}

/** Paint `map` (state bytes) into `out` (packed pixels) through `lut`; missing cells are state 0. */
export function fillCells(map: Uint8Array, lut: Uint32Array, out: Uint32Array): void {
  const n = Math.min(map.length, out.length);
  for (let i = 0; i < n; i++) out[i] = lut[map[i]!]!;
  if (n < out.length) out.fill(lut[0]!, n);
}

type Ctx2D = CanvasRenderingContext2D;

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  parent?: HTMLElement,
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  parent?.appendChild(node);
  return node;
}

export function createHeatmap(parent: HTMLElement, options: HeatmapOptions): HeatmapView {
  const root = el("div", "ndbg-map", parent);
  root.style.setProperty("--ndbg-row-height", `${ROW_HEIGHT}px`);
  const scroll = el("div", "ndbg-map-scroll", root);
  scroll.style.maxHeight = `${MAX_VIEW_HEIGHT}px`;
  const body = el("div", "ndbg-map-body", scroll);
  const labels = el("div", "ndbg-map-labels", body);
  const cells = el("div", "ndbg-map-cells", body);
  const canvas = el("canvas", "ndbg-map-canvas", cells);
  const axis = el("div", "ndbg-map-axis", root);
  const legend = el("div", "ndbg-legend", root);
  const tooltip = el("div", "ndbg-tooltip", root);
  tooltip.hidden = true;
  const empty = el("div", "ndbg-map-empty", root);
  empty.textContent = "no layers recorded yet";

  let snap: Snapshot | null = null;
  let palette: Palette | null = null;
  let lut: Uint32Array = new Uint32Array(256);
  let cellsDirty = true;
  let image: ImageData | null = null;
  let imageCanvas: HTMLCanvasElement | null = null;
  let hover: Cell | null = null;
  let cssWidth = 0;

  const rows = (): number => snap?.layers.length ?? 0;
  const cols = (): number => snap?.mapCols ?? 0;
  const viewHeight = (): number => Math.min(rows() * ROW_HEIGHT, MAX_VIEW_HEIGHT);

  /** Width of the cell area: from the ResizeObserver, else read once, else a guess (detached). */
  function measure(): number {
    return cssWidth || cells.clientWidth || FALLBACK_WIDTH;
  }

  function renderLabels(layers: string[]): void {
    const longest = layers.reduce((n, l) => Math.max(n, l.length), 4);
    const chars = Math.min(MAX_LABEL_CHARS, longest);
    // Labels and axis share the monospace font, so `ch` lines the axis up with the cells.
    const width = `calc(${chars + 1}ch + 11px)`;
    labels.style.width = width;
    axis.style.paddingLeft = width;
    const frag = document.createDocumentFragment();
    for (const name of layers) {
      const label = el("div", "ndbg-map-label");
      label.textContent = truncateLeft(name, chars);
      label.title = name;
      frag.appendChild(label);
    }
    labels.replaceChildren(frag);
  }

  function renderAxis(s: Snapshot): void {
    const [start, stop] = s.mapSteps;
    if (s.mapCols <= 0 || stop <= start) {
      axis.replaceChildren();
      return;
    }
    const ticks = [start, Math.floor((start + stop - 1) / 2), stop - 1];
    axis.replaceChildren(
      ...ticks.map((t, i) => {
        const span = el("span", "ndbg-map-tick");
        span.textContent = i === 0 ? `step ${t}` : String(t);
        return span;
      }),
    );
  }

  function renderLegend(p: Palette): void {
    legend.replaceChildren(
      ...p.states.map((color, state) => {
        const item = el("span", `ndbg-legend-item ndbg-legend-${stateName(state).replace(" ", "-")}`);
        const swatch = el("span", "ndbg-swatch", item);
        swatch.style.background = color;
        item.append(stateName(state));
        return item;
      }),
      (() => {
        const item = el("span", "ndbg-legend-item ndbg-legend-marker");
        item.textContent = "\u25bc event / regime shift";
        return item;
      })(),
    );
  }

  function ensurePalette(): void {
    const next = paletteFor(isDarkTheme(root.ownerDocument));
    if (next === palette) return;
    palette = next;
    lut = stateLut(palette);
    cellsDirty = true;
    renderLegend(palette);
  }

  function rebuildCells(): void {
    cellsDirty = false;
    const r = rows();
    const c = cols();
    if (r === 0 || c === 0 || !snap) {
      image = null;
      return;
    }
    if (!imageCanvas) imageCanvas = document.createElement("canvas");
    const ictx = imageCanvas.getContext("2d");
    if (!ictx) return;
    if (!image || image.width !== c || image.height !== r) {
      image = ictx.createImageData(c, r);
      imageCanvas.width = c;
      imageCanvas.height = r;
    }
    fillCells(snap.map, lut, new Uint32Array(image.data.buffer));
    ictx.putImageData(image, 0, 0);
  }

  function triangle(ctx: Ctx2D, x: number, y: number, size: number): void {
    ctx.beginPath();
    ctx.moveTo(x - size / 2, y);
    ctx.lineTo(x + size / 2, y);
    ctx.lineTo(x, y + size * 0.8);
    ctx.closePath();
    ctx.fill();
  }

  function outline(ctx: Ctx2D, cell: Cell, firstY: number, cellW: number, width: number): void {
    const y = firstY + cell.row * ROW_HEIGHT;
    ctx.lineWidth = width;
    ctx.strokeRect(cell.col * cellW + width / 2, y + width / 2, Math.max(cellW - width, 1), ROW_HEIGHT - width);
  }

  function selectedCell(sel: Selection | null, s: Snapshot): Cell | null {
    if (!sel) return null;
    const row = sel.layer === null ? -1 : s.layers.indexOf(sel.layer);
    const col = bucketOf(sel.step, s.mapSteps[0], s.mapSteps[1], s.mapCols);
    return row >= 0 && col >= 0 ? { row, col } : null;
  }

  function draw(): number {
    const t0 = performance.now();
    ensurePalette();
    if (cellsDirty) rebuildCells();
    const width = measure();
    const height = viewHeight();
    const dpr = window.devicePixelRatio || 1;
    canvas.style.height = `${height}px`;
    const pw = Math.max(1, Math.round(width * dpr));
    const ph = Math.max(1, Math.round(height * dpr));
    if (canvas.width !== pw) canvas.width = pw;
    if (canvas.height !== ph) canvas.height = ph;
    const ctx = canvas.getContext("2d");
    if (ctx && snap && palette) {
      ctx.setTransform(1, 0, 0, 1, 0, 0);
      ctx.clearRect(0, 0, pw, ph);
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.imageSmoothingEnabled = false;
      const r = rows();
      const c = cols();
      const top = scroll.scrollTop;
      const first = Math.min(Math.floor(top / ROW_HEIGHT), Math.max(r - 1, 0));
      const firstY = -top; // y of row 0 in canvas coordinates
      const visible = Math.min(r - first, Math.ceil(height / ROW_HEIGHT) + 1);
      const cellW = c > 0 ? width / c : 0;
      if (imageCanvas && image && visible > 0) {
        ctx.drawImage(imageCanvas, 0, first, c, visible, 0, firstY + first * ROW_HEIGHT, width, visible * ROW_HEIGHT);
        // 1px gaps between rows keep them apart when many are alike.
        for (let row = first + 1; row < first + visible; row++) {
          ctx.clearRect(0, firstY + row * ROW_HEIGHT, width, 1);
        }
      }
      // Markers in ink (dark on light, light on dark) stand out on every state color; the
      // cell color and the tooltip carry the severity.
      const [start, stop] = snap.mapSteps;
      ctx.fillStyle = palette.ink;
      const size = Math.max(7, Math.min(10, cellW));
      for (const m of snap.markers) {
        if (m.row < first || m.row >= first + visible) continue;
        const col = bucketOf(m.step, start, stop, c);
        if (col >= 0) triangle(ctx, (col + 0.5) * cellW, firstY + m.row * ROW_HEIGHT + 1, size);
      }
      ctx.strokeStyle = palette.ink;
      const sel = selectedCell(snap.selected, snap);
      if (sel) outline(ctx, sel, firstY, cellW, 2);
      if (hover && hover.row < r && hover.col < c) outline(ctx, hover, firstY, cellW, 1);
    }
    return performance.now() - t0;
  }

  function cellAt(x: number, y: number): Cell | null {
    const r = rows();
    const c = cols();
    if (r === 0 || c === 0) return null;
    const width = measure();
    const row = Math.floor((y + scroll.scrollTop) / ROW_HEIGHT);
    const col = Math.floor((x / width) * c);
    if (row < 0 || row >= r || col < 0 || col >= c || y < 0 || y >= viewHeight()) return null;
    return { row, col };
  }

  function tooltipText(cell: Cell, s: Snapshot): HTMLElement[] {
    const [start, stop] = s.mapSteps;
    const i = cell.row * s.mapCols + cell.col;
    const [lo, hi] = stepRange(cell.col, start, stop, s.mapCols);
    const line = (cls: string, text: string): HTMLElement => {
      const div = el("div", cls);
      div.textContent = text;
      return div;
    };
    const out = [
      line("ndbg-tooltip-layer", s.layers[cell.row] ?? ""),
      line("ndbg-tooltip-steps", rangeLabel(lo, hi)),
      line("ndbg-tooltip-state", `state: ${stateName(s.map[i] ?? 0)}`),
      line("ndbg-tooltip-grad", `grad norm: ${formatLog10(s.mapValues[i] ?? Number.NaN)}`),
      line("ndbg-tooltip-act", `act |max|: ${formatLog10(s.mapAct[i] ?? Number.NaN)}`),
    ];
    for (const m of s.markers) {
      if (m.row === cell.row && bucketOf(m.step, start, stop, s.mapCols) === cell.col) {
        out.push(line(`ndbg-tooltip-marker ndbg-sev-${m.severity}`, `\u25bc ${m.kind} at step ${m.step}`));
      }
    }
    return out;
  }

  function pointer(e: MouseEvent): { x: number; y: number } {
    const rect = canvas.getBoundingClientRect();
    return { x: e.clientX - rect.left, y: e.clientY - rect.top };
  }

  function onMove(e: MouseEvent): void {
    const { x, y } = pointer(e);
    const cell = cellAt(x, y);
    const same = cell && hover && cell.row === hover.row && cell.col === hover.col;
    if (!same) {
      hover = cell;
      options.requestDraw();
    }
    if (!cell || !snap) {
      tooltip.hidden = true;
      return;
    }
    if (!same) tooltip.replaceChildren(...tooltipText(cell, snap));
    tooltip.hidden = false;
    const rootRect = root.getBoundingClientRect();
    tooltip.style.left = `${e.clientX - rootRect.left + 14}px`;
    tooltip.style.top = `${e.clientY - rootRect.top + 14}px`;
  }

  function onLeave(): void {
    tooltip.hidden = true;
    if (hover) {
      hover = null;
      options.requestDraw();
    }
  }

  function onClick(e: MouseEvent): void {
    const { x, y } = pointer(e);
    const cell = cellAt(x, y);
    if (cell) options.onCellClick(cell);
  }

  const onScroll = (): void => options.requestDraw();
  canvas.addEventListener("mousemove", onMove);
  canvas.addEventListener("mouseleave", onLeave);
  canvas.addEventListener("click", onClick);
  scroll.addEventListener("scroll", onScroll, { passive: true });

  let resize: ResizeObserver | null = null;
  if (typeof ResizeObserver !== "undefined") {
    resize = new ResizeObserver(() => {
      const w = cells.clientWidth;
      if (w > 0 && w !== cssWidth) {
        cssWidth = w;
        options.requestDraw();
      }
    });
    resize.observe(cells);
  }

  return {
    el: root,
    update(next, changed) {
      snap = next;
      if (changed.has("layers")) {
        renderLabels(next.layers);
        cellsDirty = true;
      }
      if (changed.has("map") || changed.has("map_cols")) cellsDirty = true;
      if (changed.has("map_steps") || changed.has("map_cols")) renderAxis(next);
      const height = next.layers.length * ROW_HEIGHT;
      body.style.height = `${height}px`;
      root.classList.toggle("ndbg-map-is-empty", next.layers.length === 0);
      if (hover && (hover.row >= rows() || hover.col >= cols())) {
        hover = null;
        tooltip.hidden = true;
      } else if (hover && !tooltip.hidden) {
        tooltip.replaceChildren(...tooltipText(hover, next));
      }
    },
    draw,
    cellAt,
    dispose() {
      resize?.disconnect();
      canvas.removeEventListener("mousemove", onMove);
      canvas.removeEventListener("mouseleave", onLeave);
      canvas.removeEventListener("click", onClick);
      scroll.removeEventListener("scroll", onScroll);
    },
  };
}
