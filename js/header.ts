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
};

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
      badge.className = `ndbg-status ndbg-status-${status}`;
      badge.textContent = STATUS_LABELS[status];
      step.textContent = `step ${snap.step}`;
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
