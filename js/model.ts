/**
 * The panel's model: the traits the Python widget syncs, typed, plus the readers that turn
 * the binary traits (traitlets.Bytes arrive as DataView) into typed arrays.
 *
 * Mirrors the Python panel widget trait for trait (tests/test_one_home.py checks
 * that `TRAITS` and the Python traits agree); Python -> JS unless marked otherwise.
 */
import type { AnyModel } from "@anywidget/types";

export type Status = "training" | "finished" | "stopped" | "raised" | "interrupted" | "exited";
export type Severity = "info" | "warning" | "error";

/** Cell states in `map`: the worst state in the bucket. */
export const CellState = { NoData: 0, Healthy: 1, Warning: 2, Error: 3 } as const;
export type CellState = (typeof CellState)[keyof typeof CellState];

export interface Marker {
  row: number;
  step: number;
  kind: string;
  severity: Severity;
}

export interface FirstFailure {
  id: number;
  step: number;
  layer: string | null;
  kind: string;
  severity: Severity;
  message: string;
}

export interface PanelEvent extends FirstFailure {
  /** id of the event this one is a symptom of, or null for a cause. */
  symptom_of: number | null;
}

/** An event one run has and the other lacks (the first of its kind and layer). */
export interface OnlyEvent {
  step: number;
  layer: string | null;
  kind: string;
  severity: Severity;
  message: string;
}

/** Where this run parts from a baseline run (`panel_state.baseline`). */
export interface Baseline {
  /** The baseline's name (its file, or "the baseline"). */
  name: string;
  /** The one-line sentence: where they part, or that they do not. */
  sentence: string;
  /** The parting step; null where they do not part. */
  step: number | null;
  /** The parting layer; null for the loss (or no parting). */
  layer: string | null;
  quantity: string | null;
  /** The parting layer's row on this run's map; -1 for none. */
  row: number;
  /** Warnings and errors this run has and the baseline lacks. */
  only_run: OnlyEvent[];
  /** ...and those the baseline has and this run lacks. */
  only_baseline: OnlyEvent[];
}

/** Threshold values by setting name (neuraldbg_nb.Thresholds fields): those with a slider. */
export type Thresholds = Record<string, number>;

/** One threshold slider, described by Python from the setting it moves. */
export interface SliderSpec {
  key: string;
  label: string;
  /** The setting's meaning (its docstring), for the tooltip. */
  help: string;
  /** The setting's default, shown until Python sends `thresholds`. */
  default: number;
  min: number;
  max: number;
  /** Log scale (ratio-like settings) or linear (fractions). */
  log: boolean;
}

export interface Selection {
  layer: string | null;
  step: number;
}

/** Do two selections name the same layer and step? (Many events can share one.) */
export function isSelected(ev: Selection, sel: Selection | null): boolean {
  return sel !== null && sel.layer === ev.layer && sel.step === ev.step;
}

/**
 * What the user clicked, kept on the JS side: the `selected` trait only says layer and step,
 * which several events (and the first-failure box) can share, so the highlight follows the
 * pick instead. `selection` is what the click wrote to `selected`; the pick stands only
 * while the trait still says that.
 */
export type Clicked =
  | {
      kind: "event";
      /** The first-failure box or a feed row. */
      where: "first" | "feed";
      id: number;
      /** Identity that survives re-classification (which renumbers event ids). */
      event: PickedEvent;
      selection: Selection;
    }
  | {
      kind: "cell";
      layer: string;
      /** The bucket's steps, [lo, hi). */
      lo: number;
      hi: number;
      selection: Selection;
    };

export interface PickedEvent {
  layer: string | null;
  step: number;
  kind: string;
}

export function eventPick(ev: FirstFailure, where: "first" | "feed"): Clicked {
  return {
    kind: "event",
    where,
    id: ev.id,
    event: { layer: ev.layer, step: ev.step, kind: ev.kind },
    selection: { layer: ev.layer, step: ev.step },
  };
}

function sameEvent(ev: FirstFailure, id: PickedEvent): boolean {
  return ev.layer === id.layer && ev.step === id.step && ev.kind === id.kind;
}

/** Is the pick still what `selected` says (not closed, not replaced from Python)? */
export function pickStands(pick: Clicked | null, selected: Selection | null): pick is Clicked {
  return pick !== null && isSelected(pick.selection, selected);
}

/**
 * The ids of the feed rows to highlight for `pick`: the clicked event (by id, else by
 * layer, step and kind when re-classification renumbered the events), or the events of
 * the clicked cell's layer in its bucket. Empty when the pick no longer stands or was the
 * first-failure box.
 */
export function pickedIds(events: readonly PanelEvent[], pick: Clicked | null, selected: Selection | null): Set<number> {
  const out = new Set<number>();
  if (!pickStands(pick, selected)) return out;
  if (pick.kind === "cell") {
    for (const ev of events) {
      if (ev.layer === pick.layer && ev.step >= pick.lo && ev.step < pick.hi) out.add(ev.id);
    }
    return out;
  }
  if (pick.where !== "feed") return out;
  const byId = events.find((ev) => ev.id === pick.id && sameEvent(ev, pick.event));
  const hit = byId ?? events.find((ev) => sameEvent(ev, pick.event));
  if (hit) out.add(hit.id);
  return out;
}

/** Highlight the first-failure box? Only when it was clicked and still shows that event. */
export function firstPicked(first: FirstFailure | null, pick: Clicked | null, selected: Selection | null): boolean {
  return (
    first !== null && pickStands(pick, selected) && pick.kind === "event" && pick.where === "first" && sameEvent(first, pick.event)
  );
}

/** Binary traits: a DataView from the widget manager; other views tolerated (tests, old managers). */
export type Binary = DataView | ArrayBuffer | ArrayBufferView | null | undefined;

export interface PanelTraits {
  layers: string[];
  status: Status;
  step: number;
  /** float32 little-endian, <= 256 points; NaN = missing or non-finite. */
  loss: Binary;
  /** uint8, n_layers x map_cols, row-major; values are CellState. */
  map: Binary;
  map_cols: number;
  /** [start, stop): the step range the map columns cover. */
  map_steps: [number, number];
  /** float32 LE, n_layers x map_cols: log10 grad norm of the worst step in the bucket (NaN: none). */
  map_values: Binary;
  /** float32 LE, n_layers x map_cols: log10 activation abs-max of that step (NaN: none). */
  map_act: Binary;
  markers: Marker[];
  first_failure: FirstFailure | null;
  /** What probably made the first failure happen there, in sentences (empty: none found). */
  likely_causes: string[];
  events: PanelEvent[];
  /** Two-way: sliders write it back. */
  thresholds: Thresholds;
  /** The sliders, in order: which settings, their labels, spans and scales. */
  sliders: SliderSpec[];
  /** JS -> Python: the event or cell the user clicked; null when the inspector is closed. */
  selected: Selection | null;
  inspector_html: string;
  message: string;
  /** What watching costs, e.g. "watching +1.0 ms/step (+3.1%)"; empty until measured. */
  cost: string;
  /** The sentence behind it (ms per step, the parts, a budget note), for the tooltip. */
  cost_detail: string;
  /** What the run could not watch, or stopped watching (run.notes, less the budget note). */
  notes: string[];
  /** Where this run parts from a baseline run; null without one. */
  baseline: Baseline | null;
}

export type PanelModel = AnyModel<PanelTraits>;
export type TraitName = keyof PanelTraits;

export const TRAITS: readonly TraitName[] = [
  "layers",
  "status",
  "step",
  "loss",
  "map",
  "map_cols",
  "map_steps",
  "map_values",
  "map_act",
  "markers",
  "first_failure",
  "likely_causes",
  "events",
  "thresholds",
  "sliders",
  "selected",
  "inspector_html",
  "message",
  "cost",
  "cost_detail",
  "notes",
  "baseline",
];

/** Byte order of typed arrays on this machine (ImageData pixels, float32 views). */
export const LITTLE_ENDIAN_HOST = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

function bytesOf(value: Binary): Uint8Array {
  if (value == null) return new Uint8Array(0);
  if (value instanceof ArrayBuffer) return new Uint8Array(value);
  return new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
}

export function readUint8(value: Binary): Uint8Array {
  return bytesOf(value);
}

/** A float32 little-endian buffer as a Float32Array (copied when unaligned or big-endian host). */
export function readFloat32(value: Binary): Float32Array {
  const bytes = bytesOf(value);
  const n = Math.floor(bytes.byteLength / 4);
  if (bytes.byteOffset % 4 === 0 && LITTLE_ENDIAN_HOST) {
    return new Float32Array(bytes.buffer, bytes.byteOffset, n);
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, n * 4);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = view.getFloat32(i * 4, true);
  return out;
}

/** Everything the views read, decoded once per change. */
export interface Snapshot {
  layers: string[];
  status: Status;
  step: number;
  loss: Float32Array;
  map: Uint8Array;
  mapCols: number;
  mapSteps: [number, number];
  mapValues: Float32Array;
  mapAct: Float32Array;
  markers: Marker[];
  firstFailure: FirstFailure | null;
  likelyCauses: string[];
  events: PanelEvent[];
  thresholds: Thresholds;
  sliders: SliderSpec[];
  selected: Selection | null;
  inspectorHtml: string;
  message: string;
  cost: string;
  costDetail: string;
  notes: string[];
  baseline: Baseline | null;
}

/** The sliders' defaults: what they show until Python sends `thresholds`. */
export function defaults(sliders: readonly SliderSpec[]): Thresholds {
  return Object.fromEntries(sliders.map((s) => [s.key, s.default]));
}

function steps(value: unknown): [number, number] {
  if (Array.isArray(value) && value.length >= 2) {
    return [Number(value[0]) || 0, Number(value[1]) || 0];
  }
  return [0, 0];
}

export function snapshot(model: PanelModel): Snapshot {
  const sliders = model.get("sliders") ?? [];
  return {
    layers: model.get("layers") ?? [],
    status: model.get("status") ?? "training",
    step: model.get("step") ?? 0,
    loss: readFloat32(model.get("loss")),
    map: readUint8(model.get("map")),
    mapCols: Math.max(0, Math.floor(model.get("map_cols") ?? 0)),
    mapSteps: steps(model.get("map_steps")),
    mapValues: readFloat32(model.get("map_values")),
    mapAct: readFloat32(model.get("map_act")),
    markers: model.get("markers") ?? [],
    firstFailure: model.get("first_failure") ?? null,
    likelyCauses: model.get("likely_causes") ?? [],
    events: model.get("events") ?? [],
    thresholds: { ...defaults(sliders), ...(model.get("thresholds") ?? {}) },
    sliders,
    selected: model.get("selected") ?? null,
    inspectorHtml: model.get("inspector_html") ?? "",
    message: model.get("message") ?? "",
    cost: model.get("cost") ?? "",
    costDetail: model.get("cost_detail") ?? "",
    notes: model.get("notes") ?? [],
    baseline: model.get("baseline") ?? null,
  };
}
