import { describe, expect, it } from "vitest";
import { formatLog10, formatNumber, truncateLeft } from "../format";

describe("formatNumber", () => {
  it("keeps three digits in the readable range, scientific outside", () => {
    expect(formatNumber(0.123456)).toBe("0.123");
    expect(formatNumber(12.345)).toBe("12.3");
    expect(formatNumber(1000)).toBe("1000");
    expect(formatNumber(3.16e-5)).toBe("3.2e-5");
    expect(formatNumber(1e6)).toBe("1e6");
    expect(formatNumber(-2.5e-7)).toBe("-2.5e-7");
    expect(formatNumber(0)).toBe("0");
  });

  it("spells out missing and infinite values", () => {
    expect(formatNumber(Number.NaN)).toBe("\u2014");
    expect(formatNumber(Infinity)).toBe("inf");
    expect(formatNumber(-Infinity)).toBe("-inf");
  });

  it("reads log10 values back", () => {
    expect(formatLog10(-5)).toBe("1e-5");
    expect(formatLog10(0)).toBe("1");
    expect(formatLog10(Number.NaN)).toBe("\u2014");
  });
});

describe("truncateLeft", () => {
  it("keeps the tail of long names", () => {
    expect(truncateLeft("encoder.layers.0.linear1", 10)).toBe("\u20260.linear1");
    expect(truncateLeft("encoder.layers.0.linear1", 10)).toHaveLength(10);
    expect(truncateLeft("fc1", 10)).toBe("fc1");
    expect(truncateLeft("fc1", 1)).toBe("\u2026");
  });
});
