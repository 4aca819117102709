/** A stand-in for the widget model: get/set/on/off/save_changes, change events like Backbone. */
import type { PanelModel, PanelTraits } from "../model";

type Handler = (...args: unknown[]) => void;

export class FakeModel {
  readonly values: Partial<PanelTraits>;
  readonly handlers = new Map<string, Set<Handler>>();
  saves = 0;
  /** Traits that were set since the last save, as they were when saved. */
  readonly saved: Partial<PanelTraits>[] = [];
  private pending: Partial<PanelTraits> = {};

  constructor(values: Partial<PanelTraits>) {
    this.values = { ...values };
  }

  get<K extends keyof PanelTraits>(key: K): PanelTraits[K] {
    return this.values[key] as PanelTraits[K];
  }

  /** A change from the front end (what the panel does). */
  set<K extends keyof PanelTraits>(key: K, value: PanelTraits[K]): void {
    this.pending[key] = value;
    this.update(key, value);
  }

  /** A change from Python. */
  update<K extends keyof PanelTraits>(key: K, value: PanelTraits[K]): void {
    const before = this.values[key];
    this.values[key] = value;
    if (JSON.stringify(before) === JSON.stringify(value) && !ArrayBuffer.isView(value)) return;
    for (const h of this.handlers.get(`change:${key}`) ?? []) h();
  }

  on(name: string, handler: Handler): void {
    let set = this.handlers.get(name);
    if (!set) {
      set = new Set();
      this.handlers.set(name, set);
    }
    set.add(handler);
  }

  off(name?: string | null, handler?: Handler | null): void {
    if (!name) return this.handlers.clear();
    if (!handler) return void this.handlers.delete(name);
    this.handlers.get(name)?.delete(handler);
  }

  save_changes(): void {
    this.saves++;
    this.saved.push(this.pending);
    this.pending = {};
  }

  send(): void {}

  /** An event from the widget manager or Python (`msg:custom`, `comm_live_update`, `destroy`). */
  emit(name: string, ...args: unknown[]): void {
    for (const h of this.handlers.get(name) ?? []) h(...args);
  }

  listenerCount(): number {
    let n = 0;
    for (const set of this.handlers.values()) n += set.size;
    return n;
  }

  asModel(): PanelModel {
    return this as unknown as PanelModel;
  }
}

export function f32(values: number[]): DataView {
  const arr = new Float32Array(values);
  return new DataView(arr.buffer);
}

export function u8(values: number[]): DataView {
  return new DataView(new Uint8Array(values).buffer);
}
