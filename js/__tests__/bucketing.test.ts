import { describe, expect, it } from "vitest";
import { bucketOf, centerStep, pickStep, rangeLabel, severityRank, stepRange } from "../bucketing";

describe("bucketOf / stepRange", () => {
  it("splits an even range into equal buckets", () => {
    expect([0, 9, 10, 99].map((s) => bucketOf(s, 0, 100, 10))).toEqual([0, 0, 1, 9]);
    expect(stepRange(0, 0, 100, 10)).toEqual([0, 10]);
    expect(stepRange(9, 0, 100, 10)).toEqual([90, 100]);
  });

  it("returns -1 outside [start, stop) and for an empty map", () => {
    expect(bucketOf(4, 5, 10, 5)).toBe(-1);
    expect(bucketOf(10, 5, 10, 5)).toBe(-1);
    expect(bucketOf(5, 5, 5, 5)).toBe(-1);
    expect(bucketOf(5, 0, 10, 0)).toBe(-1);
    expect(stepRange(-1, 0, 10, 5)).toEqual([0, 0]);
    expect(stepRange(5, 0, 10, 5)).toEqual([0, 0]);
  });

  it("agree with each other for every step, any range and column count (brute force)", () => {
    for (const [start, stop] of [[0, 1], [0, 7], [3, 100], [10, 333], [0, 1000], [5, 6]] as const) {
      for (const cols of [1, 2, 3, 7, 10, 64, 300]) {
        const seen = new Set<number>();
        for (let c = 0; c < cols; c++) {
          const [lo, hi] = stepRange(c, start, stop, cols);
          for (let s = lo; s < hi; s++) {
            expect(bucketOf(s, start, stop, cols)).toBe(c);
            seen.add(s);
          }
        }
        // The columns partition the range: every step in exactly one column.
        expect(seen.size).toBe(stop - start);
        // And the definition: column c covers [start + c*w, start + (c+1)*w).
        const w = (stop - start) / cols;
        for (let s = start; s < stop; s++) {
          const c = bucketOf(s, start, stop, cols);
          expect(start + c * w).toBeLessThanOrEqual(s + 1e-9);
          expect(s).toBeLessThan(start + (c + 1) * w + 1e-9);
        }
      }
    }
  });

  it("leaves columns empty when there are more columns than steps", () => {
    const ranges = Array.from({ length: 10 }, (_, c) => stepRange(c, 0, 4, 10));
    expect(ranges.filter(([lo, hi]) => hi > lo)).toHaveLength(4);
  });

  it("puts steps on a bucket edge in the upper bucket despite float rounding", () => {
    // w = 0.3 / 3 style: (step - start) / w would round wrongly; integer math does not.
    expect(bucketOf(10, 0, 30, 9)).toBe(3);
    expect(stepRange(3, 0, 30, 9)).toEqual([10, 14]);
  });
});

describe("centerStep", () => {
  it("is the middle step of the bucket, -1 if empty", () => {
    expect(centerStep(0, 0, 100, 10)).toBe(4);
    expect(centerStep(1, 0, 100, 10)).toBe(14);
    expect(centerStep(0, 0, 3, 1)).toBe(1);
    expect(centerStep(2, 0, 1, 4)).toBe(-1);
  });
});

describe("pickStep", () => {
  const events = [
    { step: 12, layer: "fc1", severity: "warning" as const },
    { step: 15, layer: "fc1", severity: "error" as const },
    { step: 17, layer: "fc1", severity: "error" as const },
    { step: 13, layer: "fc2", severity: "error" as const },
    { step: 25, layer: "fc1", severity: "error" as const },
  ];

  it("takes the earliest most severe event of the layer in the bucket", () => {
    expect(pickStep(events, "fc1", 1, 0, 100, 10)).toBe(15);
  });

  it("falls back to the bucket's center step", () => {
    expect(pickStep(events, "fc3", 1, 0, 100, 10)).toBe(14);
    expect(pickStep(events, "fc1", 5, 0, 100, 10)).toBe(54);
  });

  it("ranks severities", () => {
    expect(severityRank("error")).toBeGreaterThan(severityRank("warning"));
    expect(severityRank("warning")).toBeGreaterThan(severityRank("info"));
  });
});

describe("rangeLabel", () => {
  it("names one step or a range", () => {
    expect(rangeLabel(5, 6)).toBe("step 5");
    expect(rangeLabel(5, 9)).toBe("steps 5\u20138");
    expect(rangeLabel(5, 5)).toBe("no steps");
  });
});
