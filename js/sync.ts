/**
 * The one way the panel writes to Python: set a trait locally now (so the panel reacts at
 * once) and send all pending changes in one `save_changes()` after a short quiet period.
 */
import type { PanelModel, PanelTraits } from "./model";

export interface PythonSync {
  set<K extends keyof PanelTraits>(key: K, value: PanelTraits[K]): void;
  /** Send pending changes now. */
  flush(): void;
  /** Send pending changes and stop. */
  dispose(): void;
}

export const SAVE_DEBOUNCE_MS = 150;

/**
 * `send` wraps each `save_changes()` (default: call it): the panel passes its `Requests.send`,
 * so a send to a kernel that is gone marks it gone instead of throwing from a timer.
 */
export function createPythonSync(
  model: PanelModel,
  delayMs = SAVE_DEBOUNCE_MS,
  send: (save: () => void) => void = (save) => save(),
): PythonSync {
  let timer: ReturnType<typeof setTimeout> | undefined;
  let pending = false;

  function flush(): void {
    if (timer !== undefined) clearTimeout(timer);
    timer = undefined;
    if (!pending) return;
    pending = false;
    send(() => model.save_changes());
  }

  return {
    set(key, value) {
      model.set(key, value);
      pending = true;
      if (timer !== undefined) clearTimeout(timer);
      timer = setTimeout(flush, delayMs);
    },
    flush,
    dispose: flush,
  };
}
