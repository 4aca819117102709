/**
 * The header: status badge, step counter, what watching costs, loss sparkline with the last
 * loss; under it, the run's notes (what it could not watch, or stopped watching), which a
 * warning in the cell's output would scroll away.
 */
import { formatNumber } from "./format";
import type { Snapshot, Status } from "./model";
import { createSparkline } from "./sparkline";

export const STATUS_LABELS: Record<Status, string> = {
  training: "training",
  finished: "finished",
  stopped: "stopped at failure",
  raised: "raised",
  interrupted: "interrupted",
  exited: "exited",
};

/** A run that ended having recorded no step or no layer: it watched nothing. */
export function watchedNothing(snap: Pick<Snapshot, "status" | "step" | "layers">): boolean {
  return snap.status !== "training" && (snap.step === 0 || snap.layers.length === 0);
}

/**
 * The header's step: the last recorded step, numbered as the map's axis numbers it (from
 * 0), so the two agree; its tooltip gives the count.
 */
export function stepLabel(steps: number): string {
  return steps > 0 ? `step ${steps - 1}` : "no step yet";
}

export interface HeaderView {
  readonly el: HTMLElement;
  update(snap: Snapshot): void;
}

export function createHeader(parent: HTMLElement): HeaderView {
  const root = document.createElement("div");
  root.className = "ndbg-header";
  const title = document.createElement("span");
  title.className = "ndbg-title";
  title.textContent = "neuraldbg";
  const badge = document.createElement("span");
  const step = document.createElement("span");
  step.className = "ndbg-step";
  const cost = document.createElement("span");
  cost.className = "ndbg-cost";
  const lossBox = document.createElement("span");
  lossBox.className = "ndbg-loss";
  const lossLabel = document.createElement("span");
  lossLabel.className = "ndbg-loss-label";
  lossLabel.textContent = "loss";
  lossBox.appendChild(lossLabel);
  const spark = createSparkline(lossBox);
  const lossValue = document.createElement("span");
  lossValue.className = "ndbg-loss-value";
  lossBox.appendChild(lossValue);
  root.append(title, badge, step, cost, lossBox);
  const notes = document.createElement("div");
  notes.className = "ndbg-notes";
  notes.hidden = true;
  parent.append(root, notes);
  let shownNotes = "";

  return {
    el: root,
    update(snap) {
      const status = snap.status in STATUS_LABELS ? snap.status : "training";
      const nothing = watchedNothing(snap);
      badge.className = `ndbg-status ndbg-status-${nothing ? "nothing" : status}`;
      badge.textContent = nothing ? `${STATUS_LABELS[status]}: watched nothing` : STATUS_LABELS[status];
      step.textContent = stepLabel(snap.step);
      step.title = `${snap.step} step${snap.step === 1 ? "" : "s"} recorded (0 to ${Math.max(snap.step - 1, 0)})`;
      cost.textContent = snap.cost;
      cost.title = snap.costDetail;
      cost.hidden = !snap.cost;
      const joined = snap.notes.join("\n");
      if (joined !== shownNotes) {
        shownNotes = joined;
        notes.replaceChildren(
          ...snap.notes.map((text) => {
            const line = document.createElement("div");
            line.className = "ndbg-note";
            line.textContent = text;
            return line;
          }),
        );
        notes.hidden = snap.notes.length === 0;
      }
      const g = spark.update(snap.loss);
      const lastRaw = snap.loss.length ? snap.loss[snap.loss.length - 1]! : Number.NaN;
      lossValue.textContent = !snap.loss.length ? "\u2014" : Number.isNaN(lastRaw) ? "NaN" : formatNumber(lastRaw);
      lossValue.classList.toggle("ndbg-nonfinite", snap.loss.length > 0 && !Number.isFinite(lastRaw));
      lossValue.title = Number.isFinite(g.last) ? `last finite loss ${formatNumber(g.last)}` : "";
    },
  };
}
