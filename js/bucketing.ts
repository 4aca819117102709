/**
 * Map columns <-> optimizer steps. Column c covers steps [start + c*w, start + (c+1)*w) with
 * w = (stop - start) / cols. Integer arithmetic, so a step on a bucket edge never lands in
 * the wrong column through rounding. Python buckets the same way:
 * `col = (step - start) * cols // (stop - start)`.
 */
import type { PanelEvent, Severity } from "./model";

/** The column of `step`, or -1 when the step is outside [start, stop) or the map is empty. */
export function bucketOf(step: number, start: number, stop: number, cols: number): number {
  const span = stop - start;
  if (cols <= 0 || span <= 0 || step < start || step >= stop) return -1;
  return Math.min(cols - 1, Math.floor(((step - start) * cols) / span));
}

/** The integer steps [lo, hi) of column `col`; lo === hi when the column holds no step. */
export function stepRange(col: number, start: number, stop: number, cols: number): [number, number] {
  const span = stop - start;
  if (cols <= 0 || span <= 0 || col < 0 || col >= cols) return [start, start];
  const edge = (c: number): number => start + Math.ceil((c * span) / cols);
  return [edge(col), edge(col + 1)];
}

/** The middle step of a column (the lower of the two middles), or -1 for an empty column. */
export function centerStep(col: number, start: number, stop: number, cols: number): number {
  const [lo, hi] = stepRange(col, start, stop, cols);
  if (hi <= lo) return -1;
  return lo + Math.floor((hi - lo - 1) / 2);
}

const RANK: Record<Severity, number> = { info: 0, warning: 1, error: 2 };

export function severityRank(severity: Severity): number {
  return RANK[severity] ?? 0;
}

/**
 * The step to inspect for a click on (layer, column): the step of the most severe event of
 * that layer inside the bucket (the earliest among equals), else the bucket's center step.
 */
export function pickStep(
  events: readonly Pick<PanelEvent, "step" | "layer" | "severity">[],
  layer: string | null,
  col: number,
  start: number,
  stop: number,
  cols: number,
): number {
  const [lo, hi] = stepRange(col, start, stop, cols);
  let best = -1;
  let bestRank = -1;
  for (const ev of events) {
    if (ev.layer !== layer || ev.step < lo || ev.step >= hi) continue;
    const rank = severityRank(ev.severity);
    if (rank > bestRank || (rank === bestRank && ev.step < best)) {
      best = ev.step;
      bestRank = rank;
    }
  }
  return best >= 0 ? best : centerStep(col, start, stop, cols);
}

/** Human label of a step range: "step 12" or "steps 12-15". */
export function rangeLabel(lo: number, hi: number): string {
  if (hi <= lo) return "no steps";
  return hi - lo === 1 ? `step ${lo}` : `steps ${lo}\u2013${hi - 1}`;
}
