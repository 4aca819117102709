/**
 * The neuraldbg panel (anywidget front end). Wires the model to the views: a trait change
 * marks the trait dirty, and one requestAnimationFrame callback per frame updates only the
 * views that read it. Writes to Python go through the one debounced sync helper; the
 * requests among them (a click, a slider) wait for Python's answer a bounded time, and a
 * kernel that is gone is said so (`requests`).
 */
import type { RenderProps } from "@anywidget/types";
import { createBaseline } from "./baseline";
import { pickStep, stepRange } from "./bucketing";
import { createFeed } from "./feed";
import { createHeader } from "./header";
import { paletteCss } from "./colors";
import { createHeatmap, type Cell } from "./heatmap";
import { createInspector } from "./inspector";
import { snapshot, TRAITS, type PanelTraits, type Clicked, type Thresholds, type TraitName } from "./model";
import css from "./panel.css";
import { createRequests, KERNEL_GONE, managerKernelGone, NO_ANSWER, type RequestKind } from "./requests";
import { createSliders } from "./sliders";
import { createPythonSync } from "./sync";

/** Traits whose change means Python answered a thresholds change. */
const RECLASSIFIED: ReadonlySet<TraitName> = new Set<TraitName>(["events", "map", "markers", "first_failure", "likely_causes", "message"]);

const HEADER: readonly TraitName[] = ["status", "step", "loss", "cost", "cost_detail", "notes"];
const MAP: readonly TraitName[] = ["layers", "map", "map_cols", "map_steps", "map_values", "map_act", "markers", "selected", "baseline"];
const FEED: readonly TraitName[] = ["events", "first_failure", "likely_causes", "selected", "status"];

function touches(changed: ReadonlySet<TraitName>, traits: readonly TraitName[]): boolean {
  return traits.some((t) => changed.has(t));
}

function render({ model, el }: Pick<RenderProps<PanelTraits>, "model" | "el">): () => void {
  const root = document.createElement("div");
  root.className = "ndbg-panel";
  const style = document.createElement("style");
  style.textContent = paletteCss() + css;
  root.appendChild(style);
  el.appendChild(root);

  const alert = document.createElement("div");
  alert.className = "ndbg-alert";
  alert.setAttribute("role", "alert");
  alert.hidden = true;
  function say(text: string): void {
    alert.textContent = text;
    alert.hidden = text === "";
  }
  const requests = createRequests(model, {
    timed: () => (model.get("status") ?? "training") !== "training",
    kernelGone: () => managerKernelGone(model),
    onTimeout(kind: RequestKind) {
      say(requests.gone ? KERNEL_GONE : NO_ANSWER);
      if (kind === "selected") inspector.fail(requests.gone ? "the kernel is gone" : "no answer from the kernel");
      else setReclassifying(false);
    },
    onAnswer() {
      if (alert.textContent === NO_ANSWER && !requests.pending("selected") && !requests.pending("thresholds")) say("");
    },
    onGone() {
      root.classList.add("ndbg-gone");
      root.dataset.kernel = "gone";
      say(KERNEL_GONE);
      if (inspector.waiting) inspector.fail("the kernel is gone");
      setReclassifying(false);
    },
  });
  const sync = createPythonSync(model, undefined, requests.send);
  const first = snapshot(model);
  /** Traits changed since the last frame; the map also repaints on scroll, hover, resize. */
  const dirty = new Set<TraitName>();
  let mapDirty = false;
  /** What the user last clicked (the trait says only layer and step); the feed shows it. */
  let pick: Clicked | null = null;
  let feedDirty = false;
  let frame: number | null = null;
  /** The status last drawn: the map shows the first failure's row once training ends. */
  let shownStatus: string | null = null;

  const header = createHeader(root);
  root.appendChild(alert);
  const message = document.createElement("div");
  message.className = "ndbg-message";
  root.appendChild(message);

  function select(next: Clicked): void {
    pick = next;
    // The trait may not change (same layer and step as before), so repaint the feed anyway.
    feedDirty = true;
    inspector.expect(next.selection);
    if (inspector.waiting) requests.ask("selected");
    sync.set("selected", next.selection);
    sync.flush(); // a click is one act: ask Python at once (the debounce is for sliders)
    schedule();
  }

  const baseline = createBaseline(root, {
    onSelect(selection) {
      select({ kind: "event", where: "feed", id: -1, event: { layer: selection.layer, step: selection.step, kind: "parting" }, selection });
    },
  });
  const heatmap = createHeatmap(root, {
    onCellClick(cell: Cell) {
      const s = snapshot(model);
      const layer = s.layers[cell.row];
      if (layer === undefined) return;
      const [start, stop] = s.mapSteps;
      const step = pickStep(s.events, layer, cell.col, start, stop, s.mapCols);
      if (step < 0) return;
      const [lo, hi] = stepRange(cell.col, start, stop, s.mapCols);
      select({ kind: "cell", layer, lo, hi, selection: { layer, step } });
    },
    requestDraw() {
      mapDirty = true;
      schedule();
    },
  });
  const inspector = createInspector(root, {
    onClose() {
      pick = null;
      sync.set("selected", null);
    },
  });
  const feed = createFeed(root, { onSelect: select });

  let reclassifying = false;
  function setReclassifying(on: boolean): void {
    reclassifying = on;
    sliders.setBusy(on);
    root.dataset.reclassifying = String(on);
  }
  const sliders = createSliders(root, first.sliders, first.thresholds, {
    onChange(thresholds: Thresholds) {
      setReclassifying(true);
      requests.ask("thresholds");
      sync.set("thresholds", thresholds);
    },
  });
  root.dataset.reclassifying = "false";

  function schedule(): void {
    if (frame === null) frame = requestAnimationFrame(flush);
  }

  function flush(): void {
    frame = null;
    const changed = new Set(dirty);
    dirty.clear();
    const s = snapshot(model);
    if (touches(changed, HEADER)) {
      header.update(s);
      root.dataset.status = s.status;
      root.dataset.step = String(s.step);
    }
    if (changed.has("message")) message.textContent = s.message;
    if (touches(changed, MAP)) {
      heatmap.update(s, changed);
      mapDirty = true;
    }
    const ended = shownStatus !== s.status && s.status !== "training";
    if (changed.has("status")) shownStatus = s.status;
    if (changed.has("selected") && s.selected?.layer != null) {
      heatmap.revealRow(s.layers.indexOf(s.selected.layer));
    } else if ((ended || changed.has("first_failure")) && s.firstFailure?.layer != null && !s.selected) {
      heatmap.revealRow(s.layers.indexOf(s.firstFailure.layer));
    }
    if (changed.has("baseline")) baseline.update(s.baseline);
    if (changed.has("inspector_html")) inspector.setHtml(s.inspectorHtml, s.selected);
    if (feedDirty || touches(changed, FEED)) {
      feedDirty = false;
      feed.update(s, pick);
    }
    if (changed.has("thresholds") || changed.has("sliders")) sliders.update(s.thresholds, s.sliders);
    if (mapDirty) {
      mapDirty = false;
      root.dataset.drawMs = heatmap.draw().toFixed(2);
    }
  }

  const listeners = TRAITS.map((name) => {
    const handler = (): void => {
      if (reclassifying && RECLASSIFIED.has(name)) {
        setReclassifying(false);
        requests.answer("thresholds");
      }
      if (name === "inspector_html") requests.answer("selected");
      dirty.add(name);
      schedule();
    };
    model.on(`change:${name}`, handler);
    return [name, handler] as const;
  });

  // Theme switches repaint the canvas (its colors are not CSS).
  const themeWatch =
    typeof MutationObserver !== "undefined"
      ? new MutationObserver(() => {
          mapDirty = true;
          schedule();
        })
      : null;
  if (themeWatch && document.body) {
    themeWatch.observe(document.body, { attributes: true, attributeFilter: ["data-jp-theme-light", "class"] });
  }

  for (const name of TRAITS) dirty.add(name);
  flush();

  return () => {
    for (const [name, handler] of listeners) model.off(`change:${name}`, handler);
    if (frame !== null) cancelAnimationFrame(frame);
    requests.dispose();
    themeWatch?.disconnect();
    heatmap.dispose();
    sync.dispose();
    root.remove();
  };
}

export default { render };
