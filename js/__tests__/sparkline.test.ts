import { describe, expect, it } from "vitest";
import { createSparkline, sparklineGeometry } from "../sparkline";

describe("sparklineGeometry", () => {
  it("breaks the line at NaN and marks the gap", () => {
    const g = sparklineGeometry([3, 2, Number.NaN, 1, 0.5], 100, 20, 0);
    expect(g.segments).toHaveLength(2);
    expect(g.segments[0]!.split(" ")).toHaveLength(2);
    expect(g.gaps).toEqual([50]);
    expect(g.last).toBe(0.5);
    expect(g.scale).toBe("linear");
  });

  it("puts the maximum at the top and the minimum at the bottom", () => {
    const g = sparklineGeometry([4, 0], 10, 20, 0);
    expect(g.segments[0]).toBe("0,0 10,20");
  });

  it("switches to log scale when a positive loss spans more than three decades", () => {
    expect(sparklineGeometry([1, 2, 1e5], 100, 20).scale).toBe("log");
    expect(sparklineGeometry([-1, 2, 1e5], 100, 20).scale).toBe("linear");
  });

  it("handles empty, single and all-missing inputs", () => {
    expect(sparklineGeometry([], 100, 20).segments).toEqual([]);
    expect(sparklineGeometry([2], 100, 20).segments).toEqual(["50,10"]);
    const none = sparklineGeometry([Number.NaN, Number.NaN], 100, 20);
    expect(none.segments).toEqual([]);
    expect(none.gaps).toHaveLength(2);
    expect(Number.isNaN(none.last)).toBe(true);
  });
});

describe("createSparkline", () => {
  it("draws polylines and red marks", () => {
    const host = document.createElement("div");
    const spark = createSparkline(host, 100, 20);
    spark.update(new Float32Array([1, 2, Number.NaN, 3, 4, Number.NaN]));
    expect(host.querySelectorAll("polyline")).toHaveLength(2);
    expect(host.querySelectorAll(".ndbg-sparkline-nan")).toHaveLength(2);
    spark.update(new Float32Array([1, Number.NaN, 3]));
    expect(host.querySelectorAll(".ndbg-sparkline-dot")).toHaveLength(2);
  });
});
