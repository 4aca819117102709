/**
 * A baseline run beside the map: where this run parts from it (the step and layer, and the
 * comparison's one-line sentence, from `report/compare.py` through `panel_state.baseline`),
 * and the events each run has that the other lacks. A click on the parting opens it in the
 * inspector. Hidden without a baseline.
 */
import type { Baseline, OnlyEvent, Selection } from "./model";

export interface BaselineView {
  readonly el: HTMLElement;
  update(baseline: Baseline | null): void;
}

export interface BaselineOptions {
  /** The user clicked the parting: inspect this run there. */
  onSelect(selection: Selection): void;
}

/** The heading: which run this one is compared with. */
export function baselineTitle(b: Baseline): string {
  return `compared with ${b.name}`;
}

/** "step 25, layer 2" / "step 25, the loss": where they part; empty where they do not. */
export function partingLabel(b: Baseline): string {
  if (b.step === null) return "";
  return `step ${b.step}, ${b.layer === null ? "the loss" : `layer ${b.layer}`}`;
}

function eventLine(e: OnlyEvent): string {
  return `${e.severity} \u00b7 step ${e.step}: ${e.message}`;
}

export function createBaseline(parent: HTMLElement, options: BaselineOptions): BaselineView {
  const root = document.createElement("div");
  root.className = "ndbg-baseline";
  root.hidden = true;
  parent.appendChild(root);
  let current: Baseline | null = null;

  function list(title: string, events: readonly OnlyEvent[], cls: string): HTMLElement | null {
    if (events.length === 0) return null;
    const box = document.createElement("div");
    box.className = `ndbg-baseline-only ${cls}`;
    const head = document.createElement("div");
    head.className = "ndbg-baseline-only-title";
    head.textContent = title;
    const ul = document.createElement("ul");
    for (const e of events) {
      const li = document.createElement("li");
      li.className = `ndbg-sev-${e.severity}`;
      li.textContent = eventLine(e);
      ul.appendChild(li);
    }
    box.append(head, ul);
    return box;
  }

  return {
    el: root,
    update(b) {
      if (b === current) return;
      current = b;
      root.replaceChildren();
      root.hidden = b === null;
      if (b === null) return;
      const title = document.createElement("div");
      title.className = "ndbg-baseline-title";
      title.textContent = baselineTitle(b);
      root.appendChild(title);
      const sentence = document.createElement("div");
      sentence.className = "ndbg-baseline-sentence";
      root.dataset.parts = String(b.step !== null);
      if (b.step !== null) {
        const where = document.createElement("button");
        where.type = "button";
        where.className = "ndbg-baseline-parting";
        where.title = "inspect this run where it parts from the baseline";
        where.textContent = `parts at ${partingLabel(b)}`;
        const step = b.step;
        where.addEventListener("click", () => options.onSelect({ layer: b.layer, step }));
        root.appendChild(where);
      }
      sentence.textContent = b.sentence;
      root.appendChild(sentence);
      for (const box of [
        list("only in this run:", b.only_run, "ndbg-baseline-only-run"),
        list(`only in ${b.name}:`, b.only_baseline, "ndbg-baseline-only-base"),
      ]) {
        if (box) root.appendChild(box);
      }
    },
  };
}
