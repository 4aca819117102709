import { describe, expect, it } from "vitest";
import { buildFeed } from "../feed";
import type { PanelEvent } from "../model";

function ev(id: number, step: number, symptom_of: number | null = null, layer: string | null = "fc"): PanelEvent {
  return { id, step, layer, kind: "regime_shift", severity: "error", message: `event ${id}`, symptom_of };
}

describe("buildFeed", () => {
  it("groups symptoms under their cause, following chains to the root", () => {
    const layout = buildFeed([ev(1, 10), ev(2, 11, 1), ev(3, 12), ev(4, 13, 2), ev(5, 14, 1)]);
    expect(layout.hidden).toBe(0);
    expect(layout.groups.map((g) => [g.cause.id, g.symptoms.map((s) => s.id)])).toEqual([
      [1, [2, 4, 5]],
      [3, []],
    ]);
  });

  it("treats a symptom whose cause is not in the list as a cause", () => {
    const layout = buildFeed([ev(2, 11, 99), ev(3, 12, 2)]);
    expect(layout.groups.map((g) => g.cause.id)).toEqual([2]);
    expect(layout.groups[0]!.symptoms.map((s) => s.id)).toEqual([3]);
  });

  it("survives a cycle in symptom_of", () => {
    const layout = buildFeed([ev(1, 1, 2), ev(2, 2, 1)]);
    expect(layout.groups.flatMap((g) => [g.cause, ...g.symptoms])).toHaveLength(2);
  });

  it("keeps the latest groups within the cap and counts the rest", () => {
    const events = Array.from({ length: 500 }, (_, i) => ev(i, i));
    const layout = buildFeed(events, 200);
    expect(layout.groups).toHaveLength(200);
    expect(layout.groups[0]!.cause.id).toBe(300);
    expect(layout.groups.at(-1)!.cause.id).toBe(499);
    expect(layout.hidden).toBe(300);
  });

  it("caps the symptoms shown under one cause", () => {
    const events = [ev(0, 0), ...Array.from({ length: 50 }, (_, i) => ev(i + 1, i + 1, 0))];
    const layout = buildFeed(events, 200, 20);
    expect(layout.groups[0]!.symptoms).toHaveLength(20);
    expect(layout.groups[0]!.moreSymptoms).toBe(30);
    expect(layout.hidden).toBe(0);
  });

  it("always shows the latest group even when it alone exceeds the cap", () => {
    const events = [ev(0, 0), ...Array.from({ length: 50 }, (_, i) => ev(i + 1, i + 1, 0))];
    const layout = buildFeed(events, 5, 20);
    expect(layout.groups).toHaveLength(1);
  });
});
