import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { createPythonSync, SAVE_DEBOUNCE_MS } from "../sync";
import { FakeModel } from "./fake-model";

describe("createPythonSync", () => {
  beforeEach(() => {
    vi.useFakeTimers();
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it("sets at once and saves once after a quiet period", () => {
    const model = new FakeModel({});
    const sync = createPythonSync(model.asModel());
    sync.set("selected", { layer: "a", step: 1 });
    sync.set("selected", { layer: "b", step: 2 });
    expect(model.values.selected).toEqual({ layer: "b", step: 2 });
    expect(model.saves).toBe(0);
    vi.advanceTimersByTime(SAVE_DEBOUNCE_MS - 1);
    expect(model.saves).toBe(0);
    vi.advanceTimersByTime(1);
    expect(model.saves).toBe(1);
    vi.advanceTimersByTime(10 * SAVE_DEBOUNCE_MS);
    expect(model.saves).toBe(1);
  });

  it("flushes pending changes on dispose, and only pending ones", () => {
    const model = new FakeModel({});
    const sync = createPythonSync(model.asModel());
    sync.dispose();
    expect(model.saves).toBe(0);
    sync.set("message", "x");
    sync.dispose();
    expect(model.saves).toBe(1);
    vi.runAllTimers();
    expect(model.saves).toBe(1);
  });
});
