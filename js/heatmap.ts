/**
 * The health map: one row per layer (forward order, top to bottom), one column per step
 * bucket. Cells are painted once per data change into a cols x rows pixel image
 * (ImageData + putImageData, one uint32 write per cell) and scaled onto the visible canvas
 * with one drawImage; scrolling and hovering only repeat that drawImage. The canvas is as
 * tall as the viewport (rows scroll beneath it), so 1000 layers cost what 30 do.
 *
 * When buckets are narrower than MIN_ALERT_WIDTH px, warning and error cells of the visible
 * rows are drawn again over the image, as runs widened to that width (a one-step failure
 * in a long run is not a 2 px sliver). Markers are small notches on a row's top edge and
 * the hover / selection outlines frame a cell from outside, so neither hides its color.
 */
import { bucketOf, rangeLabel, stepRange } from "./bucketing";
import { isDarkTheme, paletteFor, stateLut, stateName, type Palette } from "./colors";
import { formatLog10, truncateLeft } from "./format";
import { CellState, type Selection, type Snapshot, type TraitName } from "./model";

export const ROW_HEIGHT = 14;
/**
 * Warning and error cells are drawn at least this wide (CSS px) when the buckets are
 * narrower: a failure at one step of a long run stays visible at a glance.
 */
export const MIN_ALERT_WIDTH = 4;
/** Event markers: a small ink notch on the top edge of the row, above most of the cell. */
export const MARKER_WIDTH = 6;
export const MARKER_HEIGHT = 4;
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
  /** Scroll the map (only the map's own box) so `row` is in view, centred if it was not. */
  revealRow(row: number): void;
  dispose(): void;
}

export interface HeatmapOptions {
  /** Called on a click on a cell. */
  onCellClick(cell: Cell): void;
  /** Ask for a redraw on the next frame (scroll, hover, resize). */
  requestDraw(): void;
}

/**
 * Where this run parts from its baseline, on the map: the parting cell (row -1: the loss,
 * which has no row, so the whole column), or null without a parting in the map's range.
 */
export function partingCell(s: Pick<Snapshot, "baseline" | "mapSteps" | "mapCols" | "layers">): Cell | null {
  const b = s.baseline;
  if (!b || b.step === null) return null;
  const col = bucketOf(b.step, s.mapSteps[0], s.mapSteps[1], s.mapCols);
  if (col < 0) return null;
  const row = b.layer === null ? -1 : s.layers.indexOf(b.layer);
  if (b.layer !== null && row < 0) return null;
  return { row, col };
}

/** The dash of the parting frame (CSS px): apart from the hover and selection frames. */
export const PARTING_DASH: readonly number[] = [3, 2];

/** Paint `map` (state bytes) into `out` (packed pixels) through `lut`; missing cells are state 0. */
export function fillCells(map: Uint8Array, lut: Uint32Array, out: Uint32Array): void {
  const n = Math.min(map.length, out.length);
  for (let i = 0; i < n; i++) out[i] = lut[map[i]!]!;
  if (n < out.length) out.fill(lut[0]!, n);
}

/**
 * The horizontal extent [x0, x1) in CSS px of a cell (or run of cells) covering columns
 * [c0, c1) at `cellW` px each: widened about its center to `minWidth` when narrower, kept
 * inside [0, width], snapped to whole pixels.
 */
export function cellSpan(c0: number, c1: number, cellW: number, width: number, minWidth = MIN_ALERT_WIDTH): [number, number] {
  let x0 = c0 * cellW;
  let x1 = c1 * cellW;
  if (x1 - x0 < minWidth) {
    const mid = (x0 + x1) / 2;
    x0 = Math.max(0, Math.min(mid - minWidth / 2, width - minWidth));
    x1 = x0 + minWidth;
  }
  const a = Math.round(x0);
  return [a, Math.max(a + Math.min(minWidth, width), Math.round(x1))];
}

/**
 * Runs of cells in `state` on one row of `map`, as flat [x0, x1, x0, x1, ...] in CSS px,
 * each run at least `minWidth` wide (see cellSpan). Adjacent cells form one run, so a row
 * costs at most cols / 2 rectangles.
 */
export function stateRuns(
  map: Uint8Array,
  row: number,
  cols: number,
  state: number,
  cellW: number,
  width: number,
  minWidth = MIN_ALERT_WIDTH,
): number[] {
  const out: number[] = [];
  const base = row * cols;
  let c = 0;
  while (c < cols) {
    if (map[base + c] !== state) {
      c++;
      continue;
    }
    const start = c;
    while (c < cols && map[base + c] === state) c++;
    const [x0, x1] = cellSpan(start, c, cellW, width, minWidth);
    out.push(x0, x1);
  }
  return out;
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
  const track = el("div", "ndbg-map-axis-track", axis);
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
    // + the scroll box's 1px border; the track's width follows the cells' (draw()).
    axis.style.paddingLeft = `calc(${width} + 1px)`;
    const frag = document.createDocumentFragment();
    for (const name of layers) {
      const label = el("div", "ndbg-map-label");
      label.textContent = truncateLeft(name, chars);
      label.title = name;
      frag.appendChild(label);
    }
    labels.replaceChildren(frag);
  }

  /** First and last step at the ends, the middle step over its own column. */
  function renderAxis(s: Snapshot): void {
    const [start, stop] = s.mapSteps;
    if (s.mapCols <= 0 || stop <= start) {
      track.replaceChildren();
      return;
    }
    const tick = (cls: string, text: string): HTMLElement => {
      const span = el("span", `ndbg-map-tick ${cls}`);
      span.textContent = text;
      return span;
    };
    const ticks = [tick("ndbg-map-tick-first", `step ${start}`)];
    const mid = start + Math.floor((stop - start) / 2);
    if (mid > start && mid < stop - 1) {
      const t = tick("ndbg-map-tick-mid", String(mid));
      t.style.left = `${((mid - start + 0.5) / (stop - start)) * 100}%`;
      ticks.push(t);
    }
    if (stop - 1 > start) ticks.push(tick("ndbg-map-tick-last", String(stop - 1)));
    track.replaceChildren(...ticks);
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

  /** A `line` px frame 1px outside the cell's drawn extent (cellSpan): it never covers the cell. */
  function frame(ctx: Ctx2D, cell: Cell, firstY: number, cellW: number, width: number, height: number, line: number): void {
    const [x0, x1] = cellSpan(cell.col, cell.col + 1, cellW, width);
    const y0 = firstY + cell.row * ROW_HEIGHT + 1; // below the 1px row gap
    const y1 = firstY + (cell.row + 1) * ROW_HEIGHT;
    const out = line / 2 + 1; // path offset: the line's inner edge 1px off the cell
    const left = Math.max(line / 2, x0 - out);
    const right = Math.min(width - line / 2, x1 + out);
    const top = Math.max(line / 2, y0 - out);
    const bottom = Math.min(height - line / 2, y1 + out);
    if (y1 <= 0 || y0 >= height) return; // scrolled out of view
    ctx.lineWidth = line;
    ctx.strokeRect(left, top, right - left, bottom - top);
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
    const trackWidth = `${width}px`;
    if (track.style.width !== trackWidth) track.style.width = trackWidth;
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
        // Buckets narrower than MIN_ALERT_WIDTH: warnings, then errors on top, drawn wider.
        if (cellW < MIN_ALERT_WIDTH) {
          for (const state of [CellState.Warning, CellState.Error]) {
            ctx.fillStyle = palette.states[state];
            for (let row = first; row < first + visible; row++) {
              const runs = stateRuns(snap.map, row, c, state, cellW, width);
              const y = firstY + row * ROW_HEIGHT;
              for (let k = 0; k < runs.length; k += 2) ctx.fillRect(runs[k]!, y, runs[k + 1]! - runs[k]!, ROW_HEIGHT);
            }
          }
        }
        // 1px gaps above each row keep them apart when many are alike.
        for (let row = first; row < first + visible; row++) {
          ctx.clearRect(0, firstY + row * ROW_HEIGHT, width, 1);
        }
      }
      // Markers: small ink notches on the row's top edge, all in one path. They leave most
      // of the cell (and its state color) visible; the tooltip names the events.
      const [start, stop] = snap.mapSteps;
      ctx.fillStyle = palette.ink;
      ctx.beginPath();
      let marks = 0;
      for (const m of snap.markers) {
        if (m.row < first || m.row >= first + visible) continue;
        const col = bucketOf(m.step, start, stop, c);
        if (col < 0) continue;
        const [x0, x1] = cellSpan(col, col + 1, cellW, width);
        const x = (x0 + x1) / 2;
        const y = firstY + m.row * ROW_HEIGHT + 1; // below the row gap
        ctx.moveTo(x - MARKER_WIDTH / 2, y);
        ctx.lineTo(x + MARKER_WIDTH / 2, y);
        ctx.lineTo(x, y + MARKER_HEIGHT);
        ctx.closePath();
        marks++;
      }
      if (marks > 0) ctx.fill();
      // Where the run parts from its baseline: a dashed frame (the loss: the whole column).
      const part = partingCell(snap);
      if (part) {
        ctx.strokeStyle = palette.ink;
        ctx.setLineDash(PARTING_DASH as number[]);
        if (part.row >= 0) {
          frame(ctx, part, firstY, cellW, width, height, 2);
        } else {
          const [x0, x1] = cellSpan(part.col, part.col + 1, cellW, width);
          ctx.lineWidth = 2;
          ctx.strokeRect(x0, 1, x1 - x0, Math.max(height - 2, 1));
        }
        ctx.setLineDash([]);
      }
      // Hover, then selection: frames outside the cell, never over it.
      if (hover && hover.row < r && hover.col < c) {
        ctx.strokeStyle = palette.ink;
        frame(ctx, hover, firstY, cellW, width, height, 1);
      }
      const sel = selectedCell(snap.selected, snap);
      if (sel) {
        ctx.strokeStyle = palette.select;
        frame(ctx, sel, firstY, cellW, width, height, 2);
      }
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
    const part = partingCell(s);
    if (s.baseline && part && part.col === cell.col && (part.row === -1 || part.row === cell.row)) {
      out.push(line("ndbg-tooltip-parting", `parts from ${s.baseline.name} at step ${s.baseline.step}`));
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
    const px = e.clientX - rootRect.left;
    const tw = tooltip.offsetWidth;
    // Left of the pointer when it would run past the panel's right edge (and be cut off).
    const flip = px + 14 + tw > root.clientWidth && px - 14 - tw >= 0;
    tooltip.style.left = `${flip ? px - 14 - tw : px + 14}px`;
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
      empty.textContent = next.status === "training" ? "no layers recorded yet" : "no layers recorded";
      if (hover && (hover.row >= rows() || hover.col >= cols())) {
        hover = null;
        tooltip.hidden = true;
      } else if (hover && !tooltip.hidden) {
        tooltip.replaceChildren(...tooltipText(hover, next));
      }
    },
    draw,
    cellAt,
    revealRow(row) {
      if (row < 0 || row >= rows()) return;
      const top = row * ROW_HEIGHT;
      const view = scroll.clientHeight || viewHeight();
      if (top >= scroll.scrollTop && top + ROW_HEIGHT <= scroll.scrollTop + view) return;
      scroll.scrollTop = Math.max(0, top - (view - ROW_HEIGHT) / 2);
      options.requestDraw();
    },
    dispose() {
      resize?.disconnect();
      canvas.removeEventListener("mousemove", onMove);
      canvas.removeEventListener("mouseleave", onLeave);
      canvas.removeEventListener("click", onClick);
      scroll.removeEventListener("scroll", onScroll);
    },
  };
}
